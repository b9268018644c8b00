"""One typed-config system for the command line: pydantic models become flags, help, errors and docs.

`looprl train` reads `TrainConfig` (TOML plus `--section.field VALUE`), `looprl eval` reads
`EvalConfig` and `looprl sft` reads `SFTConfig` (flags). All three describe their fields once, in
the model (type, default, `description=`); this module turns that into argparse flags, the field
listings of `--help` and `looprl config show`, `docs/config.md`, and one-line errors that name
the flag and the fix. A user mistake is a `UsageError`: the command line prints
`error: <what> — <the fix>` and exits 2.
"""

from __future__ import annotations

import argparse
import difflib
import json
import textwrap
import types
from dataclasses import dataclass
from typing import Any, Literal, Union, cast, get_args, get_origin

from pydantic import BaseModel, ValidationError


class UsageError(Exception):
    """A user mistake: `what` went wrong and `fix` says what to do instead (printed as one line)."""

    def __init__(self, what: str, fix: str) -> None:
        self.what = " ".join(what.split())
        self.fix = " ".join(fix.split())
        super().__init__(f"{self.what} — {self.fix}")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C in a command that can say what it kept: `what` stopped, `fix` resumes it."""

    def __init__(self, what: str, fix: str) -> None:
        self.what = " ".join(what.split())
        self.fix = " ".join(fix.split())
        super().__init__(f"{self.what} — {self.fix}")


def usage_error(message: str, fix: str) -> UsageError:
    """A lower layer's message as a UsageError: its own advice after the first '; ' is the fix."""
    what, sep, own = " ".join(message.split()).partition("; ")
    return UsageError(what, own) if sep and own else UsageError(what, fix)


def nearest(name: str, choices: list[str]) -> str | None:
    """The choice nearest `name` (difflib), or None when none is close."""
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(name: str, choices: list[str]) -> str:
    """`did you mean X?` for the choice nearest `name`, or an empty string."""
    close = nearest(name, choices)
    return f"did you mean {close}?" if close else ""


# --- fields ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FieldDoc:
    """One configuration field: its dotted key, type, default and description."""

    key: str
    type: str
    default: Any
    description: str


def type_name(annotation: Any) -> str:
    """A short readable type: `int`, `float or unset`, `constant|linear|cosine`, `list of str`."""
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Literal:
        return "|".join(str(a) for a in args)
    if origin in (Union, types.UnionType):
        names = [type_name(a) for a in args if a is not type(None)]
        return " or ".join(names) + (" or unset" if type(None) in args else "")
    if origin is list:
        return f"list of {type_name(args[0])}" if args else "list"
    if origin is dict or annotation is dict:
        return "table"
    return getattr(annotation, "__name__", str(annotation))


def show_value(value: Any) -> str:
    """A value as written in TOML or on the command line (`unset` for None)."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    return json.dumps(value, default=str)


def _is_section(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def model_fields(model: type[BaseModel], prefix: str = "") -> list[FieldDoc]:
    """Every leaf field of `model`, sections flattened to dotted keys, in declaration order."""
    out: list[FieldDoc] = []
    for name, info in model.model_fields.items():
        key = f"{prefix}{name}"
        if _is_section(info.annotation):
            out += model_fields(cast(type[BaseModel], info.annotation), f"{key}.")
            continue
        default = info.get_default(call_default_factory=True)
        out.append(FieldDoc(key, type_name(info.annotation), default, info.description or ""))
    return out


def sections(model: type[BaseModel]) -> list[tuple[str, str]]:
    """(name, first docstring line) of each section of a sectioned config such as TrainConfig."""
    return [
        (name, (info.annotation.__doc__ or "").strip().splitlines()[0])
        for name, info in model.model_fields.items()
        if _is_section(info.annotation)
    ]


def fields_text(model: type[BaseModel], values: BaseModel | None = None, width: int = 100) -> str:
    """Plain-text listing of every field: `--key TYPE (default X)` then the description.

    With `values` (a loaded config), a field whose value differs from its default shows both.
    """
    lines: list[str] = []
    current = None
    for f in model_fields(model):
        section = f.key.split(".")[0] if "." in f.key else ""
        if section != current:
            current = section
            doc = dict(sections(model)).get(section, "")
            lines.append(f"[{section}]  {doc}" if section else "")
        shown = f"(default {show_value(f.default)})"
        if values is not None:
            value = _lookup(values, f.key)
            if value != f.default:
                shown = f"= {show_value(value)} (default {show_value(f.default)})"
        lines.append(f"  --{f.key} {f.type} {shown}")
        indent = " " * 6
        lines += textwrap.wrap(
            f.description, width, initial_indent=indent, subsequent_indent=indent,
            break_on_hyphens=False, break_long_words=False,
        )  # fmt: skip
    return "\n".join(lines)


def _lookup(values: BaseModel, key: str) -> Any:
    node: Any = values
    for part in key.split("."):
        node = getattr(node, part)
    return node


def fields_markdown(model: type[BaseModel]) -> str:
    """One Markdown table per section: field, type, default, description."""
    docs = dict(sections(model))
    by_section: dict[str, list[FieldDoc]] = {}
    for f in model_fields(model):
        by_section.setdefault(f.key.split(".")[0], []).append(f)
    out: list[str] = []
    for section, rows in by_section.items():
        out += [f"## `[{section}]`", "", docs.get(section, ""), ""]
        out += ["| field | type | default | description |", "|---|---|---|---|"]
        for f in rows:
            cells = [f"`{f.key}`", f.type, f"`{show_value(f.default)}`", f.description]
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        out.append("")
    return "\n".join(out)


# --- flags ----------------------------------------------------------------------------------


def flag_of(name: str) -> str:
    """The flag of a field: `num_tasks` -> `--num-tasks`; a dotted key keeps its dots."""
    return "--" + (name if "." in name else name.replace("_", "-"))


def add_model_flags(
    parser: argparse.ArgumentParser,
    model: type[BaseModel],
    *,
    skip: tuple[str, ...] = (),
    short: dict[str, str] | None = None,
) -> None:
    """One flag per top-level field of `model` (help = description and default).

    Values stay strings here and absent flags stay absent: `config_from_args` lets pydantic
    convert and validate them, so every flag is checked by the same rules as the model.
    """
    for name, info in model.model_fields.items():
        if name in skip or _is_section(info.annotation):
            continue
        flags = [*([short[name]] if short and name in short else []), flag_of(name)]
        help_text = info.description or ""
        if info.is_required():
            help_text += " (required)"
        elif (default := info.get_default(call_default_factory=True)) is not None:
            help_text += f" (default: {show_value(default)})"
        if info.annotation is bool:
            parser.add_argument(
                *flags,
                dest=name,
                action="store_true",
                default=argparse.SUPPRESS,
                help=info.description,
            )
            continue
        metavar = type_name(info.annotation).split(" or ")[0].upper()
        if "|" in metavar:
            metavar = "{" + metavar.lower().replace("|", ",") + "}"
        parser.add_argument(
            *flags, dest=name, default=argparse.SUPPRESS, metavar=metavar, help=help_text
        )


def config_from_args(
    model: type[BaseModel], values: dict[str, Any], names: dict[str, str] | None = None
) -> Any:
    """Validate flag values into `model`; a bad value is a UsageError naming the flag and the fix.

    `names` maps a field to how the user wrote it when that is not its flag (a positional).
    """
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        raise validation_error(exc, model, names or {}) from None


def validation_error(
    exc: ValidationError, model: type[BaseModel], names: dict[str, str]
) -> UsageError:
    """The first pydantic error as a UsageError (`--temperature -1: ...`, `did you mean ...?`)."""
    err = exc.errors()[0]
    key = ".".join(str(x) for x in err["loc"])
    flag = names.get(key, flag_of(key))
    if err["type"] == "extra_forbidden":
        known = [flag_of(f.key) for f in model_fields(model)]
        hint = did_you_mean(flag, known)
        return UsageError(f"unknown option {flag}", hint or "see --help for the options")
    if err["type"] == "missing":
        return UsageError(f"{flag} is required", f"pass {flag} (see --help)")
    desc = next((f for f in model_fields(model) if f.key == key), None)
    given = err.get("input")
    what = f"{flag} {given if isinstance(given, str) else show_value(given)}: {err['msg']}"
    fix = f"pass {flag} as {desc.type}: {desc.description}" if desc else "see --help"
    return UsageError(what, fix)
