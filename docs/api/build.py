"""Build the HTML API reference of looprl's public API with pdoc, and list what it shows undocumented.

    .venv/bin/python docs/api/build.py            # writes docs/api/html/ (not committed)
    .venv/bin/python docs/api/build.py --out DIR  # elsewhere
    .venv/bin/python docs/api/build.py --check    # also fail when a public name has no docstring

Open `docs/api/html/index.html` in a browser. The modules are those an environment author reads
(docs/authoring.md): records, environments and their kit, rubrics, tools, rendering, rollouts,
evaluation, the scripted engine and the scripted teachers.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PUBLIC_MODULES = (
    "looprl.types",
    "looprl.envs",
    "looprl.envs.base",
    "looprl.kit",
    "looprl.rubrics",
    "looprl.tools",
    "looprl.tools.executor",
    "looprl.tools.schema",
    "looprl.rendering",
    "looprl.rollout.loop",
    "looprl.eval.summary",
    "looprl.engines.base",
    "looprl.engines.scripted",
    "looprl.sft.teachers",
)
"""The modules of the reference, in the order of its index."""
DEFAULT_OUT = Path(__file__).resolve().parent / "html"


def build(out: Path, modules: tuple[str, ...] = PUBLIC_MODULES) -> list[Path]:
    """Render `modules` as HTML into `out` (created); returns the module pages written."""
    import pdoc
    import pdoc.render

    pdoc.render.configure(docformat="google", show_source=False, search=True)
    out.mkdir(parents=True, exist_ok=True)
    # private modules stay out (the verifiers v1 worker imports a package only its own venv has)
    pdoc.pdoc(*modules, r"!.*\._", output_directory=out)
    return [out.joinpath(*name.split(".")).with_suffix(".html") for name in modules]


def undocumented(modules: tuple[str, ...] = PUBLIC_MODULES) -> list[str]:
    """Public names the reference would show without a docstring.

    Classes, functions, methods, properties, and the fields of dataclasses and TypedDicts (one
    attribute docstring each). Module constants and the instance attributes of other classes
    are described in their module's or class's docstring, so they are not listed.
    """
    import pdoc.doc

    missing: list[str] = []
    for name in modules:
        module = pdoc.doc.Module.from_name(name)
        if not module.docstring.strip():
            missing.append(name)
        missing.extend(_missing_in(module))
    return sorted(set(missing))


def _missing_in(namespace: object) -> list[str]:
    import pdoc.doc

    missing: list[str] = []
    members = getattr(namespace, "members", {}).values()
    for member in members:
        if member.name.startswith("_") or isinstance(member, pdoc.doc.Module):
            continue
        if isinstance(member, pdoc.doc.Variable) and not _is_record(namespace):
            continue  # constants and instance attributes: described by their module or class
        module, qualname = member.taken_from
        if not _is_ours(module):
            continue  # inherited from the standard library or a dependency
        if not member.docstring.strip():
            missing.append(f"{module}.{qualname}")
        if isinstance(member, pdoc.doc.Class):
            missing.extend(_missing_in(member))
    return missing


def _is_ours(module: str) -> bool:
    """The name was defined in looprl (not inherited from the standard library or a dependency)."""
    return module.split(".")[0] == "looprl"


def _is_record(namespace: object) -> bool:
    """A dataclass or TypedDict: its fields are what the reader looks up, one docstring each."""
    import dataclasses
    import typing

    import pdoc.doc

    if not isinstance(namespace, pdoc.doc.Class):
        return False
    return dataclasses.is_dataclass(namespace.obj) or typing.is_typeddict(namespace.obj)


def main(argv: list[str] | None = None) -> int:
    """Build the reference; with --check, exit 1 listing each undocumented public name."""
    parser = argparse.ArgumentParser(description="Build looprl's API reference with pdoc.")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument("--check", action="store_true", help="fail on undocumented public names")
    args = parser.parse_args(argv)
    pages = build(args.out)
    print(f"wrote {len(pages)} module pages -> {args.out / 'index.html'}")
    missing = undocumented() if args.check else []
    for name in missing:
        print(f"undocumented: {name}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
