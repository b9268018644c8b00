"""Tool schemas: turn a typed Python function and its docstring into an OpenAI function schema.

A tool is a plain function (sync or async) with type hints on every parameter and a Google-style
docstring. Its schema, offered to the model through the chat template, is built from both:

    def add(a: int, b: int = 0) -> int:
        '''Add two integers.

        Args:
            a: The first addend.
            b: The second addend.
        '''

Parameters annotated `Annotated[T, Hidden("key")]` are hidden: they never appear in the schema
and the executor fills them from the episode state (`state["key"]`), e.g. a sandbox handle.
"""

from __future__ import annotations

import contextlib
import enum
import inspect
import json
import re
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import pydantic
import pydantic_core
from pydantic import TypeAdapter
from typing_extensions import is_typeddict

_SCALARS: tuple[type, ...] = (str, int, float, bool, type(None))
_SECTION_RE = re.compile(
    r"^\s*(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Returns?|Yields?|"
    r"Raises|Examples?|Notes?|Attributes|See Also|Warnings?|Todo|References)\s*:\s*$"
)
_ARG_SECTIONS = {"Args", "Arguments", "Parameters", "Params", "Keyword Args", "Keyword Arguments"}
_ARG_LINE_RE = re.compile(r"^\*{0,2}(?P<name>[A-Za-z_]\w*)\s*(\([^)]*\))?\s*:\s*(?P<desc>.*)$")


@dataclass(frozen=True)
class Hidden:
    """Marks a tool parameter the model never sees; the executor fills it with `state[key]`.

    Use it as `Annotated` metadata: `def run(code: str, box: Annotated[Sandbox, Hidden("sandbox")])`.
    """

    key: str
    """The episode-state key whose value fills the parameter."""

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise ValueError(f"Hidden(key) needs a non-empty state key string, got {self.key!r}")


@dataclass
class Param:
    """One parameter the model fills: its validator, whether it is required, its default."""

    name: str
    """The parameter's name."""
    annotation: Any
    """Its type annotation."""
    adapter: TypeAdapter[Any]
    """The pydantic validator of the model's value."""
    required: bool
    """The model must give it (no default)."""
    default: Any = None
    """The default when not required."""


@dataclass
class Tool:
    """A callable offered to the model.

    `schema` is the OpenAI function schema; `params` the visible parameters in signature order
    (with their pydantic validators); `hidden` maps hidden parameter names to state keys and
    `hidden_defaults` holds the defaults of hidden parameters that have one. `signature` is a
    readable form of the visible signature, shown to the model in error messages.
    """

    name: str
    """The name the model calls it by."""
    fn: Callable[..., Any]
    """The Python function (sync or async)."""
    schema: dict[str, Any]
    """The OpenAI function schema offered to the model."""
    hidden: dict[str, str] = field(default_factory=dict)
    """Hidden parameter name -> episode-state key."""
    is_async: bool = False
    """`fn` is a coroutine function (runs on the event loop, not a thread)."""
    params: dict[str, Param] = field(default_factory=dict, repr=False)
    """The visible parameters, in signature order."""
    hidden_defaults: dict[str, Any] = field(default_factory=dict, repr=False)
    """Defaults of the hidden parameters that have one."""
    signature: str = ""
    """A readable form of the visible signature, shown in error messages."""

    @property
    def description(self) -> str:
        """The tool's description as shown to the model."""
        return str(self.schema["function"].get("description", ""))


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (description, {parameter: description}).

    The description is everything before the first section header (`Args:`, `Returns:`, ...);
    parameter descriptions come from the `Args:` section, continuation lines joined by spaces.
    """
    lines = inspect.cleandoc(doc or "").splitlines()
    summary: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    base_indent: int | None = None
    current: str | None = None
    for line in lines:
        header = _SECTION_RE.match(line)
        if header and (len(line) - len(line.lstrip())) == 0:
            section, base_indent, current = header.group(1), None, None
            continue
        if section is None:
            summary.append(line)
            continue
        if section not in _ARG_SECTIONS or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if base_indent is None:
            base_indent = indent
        match = _ARG_LINE_RE.match(line.strip())
        if indent <= base_indent and match:
            current = match.group("name")
            args[current] = match.group("desc").strip()
        elif current is not None:
            args[current] = f"{args[current]} {line.strip()}".strip()
    description = re.sub(r"\n{3,}", "\n\n", "\n".join(summary)).strip()
    return description, args


def _fn_name(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str) or not name.isidentifier():
        raise TypeError(
            f"cannot name tool {fn!r}: tools must be named functions (pass name=... to make_tool "
            "for a partial or callable object)"
        )
    return name


def _check_type(tp: Any, where: str) -> None:
    """Raise TypeError unless `tp` is a type the model can fill from JSON."""
    origin = get_origin(tp)
    if tp is Any or tp in _SCALARS:
        return
    if origin is Annotated:
        if any(isinstance(m, Hidden) for m in tp.__metadata__):
            raise TypeError(
                f"{where}: Hidden(...) may only annotate a whole parameter, not a nested type"
            )
        _check_type(get_args(tp)[0], where)
        return
    if origin is Literal:
        _check_literal(tp, where)
        return
    if origin in (Union, types.UnionType, list) or tp in (list, dict):
        for arg in get_args(tp):
            _check_type(arg, where)
        return
    if origin is dict:
        key, value = get_args(tp)
        if key is not str:
            raise TypeError(f"{where}: dict keys must be str (JSON object keys), got {key!r}")
        _check_type(value, where)
        return
    if isinstance(tp, type) and (
        issubclass(tp, (enum.Enum, pydantic.BaseModel)) or is_typeddict(tp)
    ):
        return
    raise TypeError(
        f"{where}: unsupported type {tp!r}; use str, int, float, bool, list[T], dict[str, T], "
        "Literal[...], Optional[T] / T | None, an Enum, a pydantic model or a TypedDict"
    )


def _check_literal(tp: Any, where: str) -> None:
    """Raise TypeError unless every value of a `Literal[...]` is JSON-scalar."""
    for value in get_args(tp):
        if not isinstance(value, (str, int, float, bool, type(None))):
            raise TypeError(
                f"{where}: Literal values must be str, int, float, bool or None, got {value!r}"
            )


def clean_schema(node: Any, defs: dict[str, Any], stack: tuple[str, ...] = ()) -> Any:
    """A JSON schema as the model reads it: pydantic's `title` clutter dropped, `$ref`s into `defs`
    inlined (a recursive type keeps its reference; `object_schema` emits its def once).

    `stack` holds the defs being inlined, so a recursive one stops there.
    """
    if isinstance(node, list):
        return [clean_schema(item, defs, stack) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        name = ref.removeprefix("#/$defs/")
        if name in stack:  # recursive type: keep the reference, the def is emitted once
            return {"$ref": ref}
        inlined = clean_schema(defs[name], defs, (*stack, name))
        return {
            **inlined,
            **{k: clean_schema(v, defs, stack) for k, v in node.items() if k != "$ref"},
        }
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("title", "$defs"):
            continue
        if key == "properties" and isinstance(value, dict):
            out[key] = {name: clean_schema(sub, defs, stack) for name, sub in value.items()}
        else:
            out[key] = clean_schema(value, defs, stack)
    if "type" in out:  # put the type first: easier to read for people and small models
        out = {"type": out.pop("type"), **out}
    variants = out.get("anyOf")
    if isinstance(variants, list) and all(
        isinstance(v, dict) and set(v) == {"type"} for v in variants
    ):
        del out["anyOf"]
        out = {"type": [v["type"] for v in variants], **out}
    return out


def _recursive_defs(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """The `$defs` entries still referenced after inlining (recursive types only)."""
    found: dict[str, Any] = {}
    pending = [schema]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                name = ref.removeprefix("#/$defs/")
                if name not in found:
                    found[name] = clean_schema(defs[name], defs, (name,))
                    pending.append(found[name])
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return found


def _type_str(tp: Any) -> str:
    """A short readable form of an annotation (`list[int]`, `Literal['a', 'b']`, `Point | None`)."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is type(None):
        return "None"
    if tp is Any:
        return "Any"
    if origin is Annotated:
        return _type_str(args[0])
    if origin in (Union, types.UnionType):
        return " | ".join(_type_str(a) for a in args)
    if origin is Literal:
        return f"Literal[{', '.join(repr(a) for a in args)}]"
    if origin is not None and args:
        return (
            f"{getattr(origin, '__name__', str(origin))}[{', '.join(_type_str(a) for a in args)}]"
        )
    return str(getattr(tp, "__name__", tp))


def _resolve(fn: Callable[..., Any], annotation: Any, where: str) -> Any:
    """Evaluate a string annotation (`from __future__ import annotations`) in the tool's module.

    Only parameter annotations are evaluated, so a return type that cannot be resolved here
    (a class local to a test function, say) does not matter.
    """
    if not isinstance(annotation, str):
        return annotation
    namespace = dict(getattr(inspect.unwrap(fn), "__globals__", {}))
    try:
        return eval(annotation, namespace)  # the same evaluation inspect.get_annotations performs
    except Exception as exc:
        raise TypeError(
            f"{where}: cannot resolve the annotation {annotation!r} ({type(exc).__name__}: {exc}); "
            "define the types it names at module level"
        ) from exc


def _hidden_key(annotation: Any) -> str | None:
    if get_origin(annotation) is Annotated:
        keys = [m.key for m in annotation.__metadata__ if isinstance(m, Hidden)]
        return keys[0] if keys else None
    return None


def _adapter(annotation: Any, where: str) -> TypeAdapter[Any]:
    """A pydantic validator for one parameter; pydantic's refusals become TypeErrors naming it."""
    try:
        adapter: TypeAdapter[Any] = TypeAdapter(annotation)
        adapter.json_schema()
    except (pydantic.PydanticUserError, pydantic.PydanticSchemaGenerationError) as exc:
        first = str(exc).splitlines()[0]
        raise TypeError(
            f"{where}: pydantic cannot describe {_type_str(annotation)}: {first}"
        ) from exc
    return adapter


def _param_schema(param: Param, doc: str | None, defs: dict[str, Any]) -> dict[str, Any]:
    raw = param.adapter.json_schema()
    defs.update(raw.get("$defs", {}))
    prop: dict[str, Any] = clean_schema(raw, defs)
    if doc and "description" not in prop:
        prop["description"] = doc
    if not param.required:
        # a default JSON cannot show is simply not advertised
        with contextlib.suppress(pydantic_core.PydanticSerializationError, TypeError, ValueError):
            prop["default"] = param.adapter.dump_python(param.default, mode="json", warnings=False)
    return prop


def _default_str(param: Param, prop: dict[str, Any]) -> str:
    """A default as the model would write it (JSON), falling back to Python's repr."""
    return (
        json.dumps(prop["default"], ensure_ascii=False)
        if "default" in prop
        else repr(param.default)
    )


def _read_params(
    fn: Callable[..., Any], tool_name: str
) -> tuple[dict[str, Param], dict[str, str], dict[str, Any]]:
    """The visible parameters, hidden parameter -> state key, and hidden defaults of `fn`."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"tool {tool_name!r}: cannot read its signature: {exc}") from exc
    params: dict[str, Param] = {}
    hidden: dict[str, str] = {}
    hidden_defaults: dict[str, Any] = {}
    for p in sig.parameters.values():
        where = f"tool {tool_name!r}, parameter {p.name!r}"
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise TypeError(
                f"{where}: *args, **kwargs and positional-only parameters cannot be described "
                "to a model; name each parameter"
            )
        if p.annotation is p.empty:
            raise TypeError(f"{where}: missing type hint; annotate it (e.g. `{p.name}: str`)")
        annotation = _resolve(fn, p.annotation, where)
        key = _hidden_key(annotation)
        if key is not None:
            hidden[p.name] = key
            if p.default is not p.empty:
                hidden_defaults[p.name] = p.default
            continue
        _check_type(annotation, where)
        required = p.default is p.empty
        params[p.name] = Param(
            name=p.name,
            annotation=annotation,
            adapter=_adapter(annotation, where),
            required=required,
            default=None if required else p.default,
        )
    return params, hidden, hidden_defaults


def object_schema(
    properties: dict[str, Any], required: list[str], defs: dict[str, Any]
) -> dict[str, Any]:
    """The parameters schema of a tool: an object of `properties` (each already `clean_schema`d),
    with `$defs` only for the recursive types they still reference. Python tools (`make_tool`)
    and MCP tools (`looprl.mcp`) both get their schema here, so the model reads one form."""
    parameters: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
    recursive = _recursive_defs(parameters, defs)
    if recursive:
        parameters["$defs"] = recursive
    return parameters


def _parameters_schema(params: dict[str, Param], arg_docs: dict[str, str]) -> dict[str, Any]:
    """The JSON schema of the visible parameters (an object schema, `$defs` only for recursion)."""
    defs: dict[str, Any] = {}
    properties = {n: _param_schema(prm, arg_docs.get(n), defs) for n, prm in params.items()}
    return object_schema(properties, [n for n, prm in params.items() if prm.required], defs)


def make_tool(fn: Callable[..., Any], *, name: str | None = None) -> Tool:
    """Build a `Tool` (schema, validators, hidden parameters) from a typed function.

    `name` overrides the function's `__name__` (needed for lambdas, partials and callable objects).
    Raises TypeError naming the function and parameter when a hint is missing or unsupported, or
    when the signature uses *args, **kwargs or positional-only parameters.
    """
    tool_name = name or _fn_name(fn)
    params, hidden, hidden_defaults = _read_params(fn, tool_name)
    description, arg_docs = parse_docstring(inspect.getdoc(fn))
    parameters = _parameters_schema(params, arg_docs)
    shown = [
        f"{n}: {_type_str(prm.annotation)}"
        + ("" if prm.required else f" = {_default_str(prm, parameters['properties'][n])}")
        for n, prm in params.items()
    ]
    return Tool(
        name=tool_name,
        fn=fn,
        schema={
            "type": "function",
            "function": {"name": tool_name, "description": description, "parameters": parameters},
        },
        hidden=hidden,
        is_async=inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__),
        params=params,
        hidden_defaults=hidden_defaults,
        signature=f"{tool_name}({', '.join(shown)})",
    )


def tool_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI function schema (`{"type": "function", "function": {...}}`) of a typed function."""
    return make_tool(fn).schema


def make_tools(fns: Iterable[Callable[..., Any] | Tool]) -> dict[str, Tool]:
    """Build tools from functions (or ready `Tool`s), keyed by name; duplicate names raise ValueError."""
    tools: dict[str, Tool] = {}
    for fn in fns:
        tool = fn if isinstance(fn, Tool) else make_tool(fn)
        if tool.name in tools:
            raise ValueError(
                f"two tools are named {tool.name!r}; tool names must be unique (rename one, or "
                "build it with make_tool(fn, name=...))"
            )
        tools[tool.name] = tool
    return tools
