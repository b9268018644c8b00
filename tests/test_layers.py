"""The layer order of DESIGN section 10 / docs/design.md, held against every import in looprl/.

Each module belongs to a layer (`LAYERS`, keyed by package prefix) and may import only from its
own layer or below. Besides the order: no import cycle between modules, and no module imports
another module's private `_name`. Imports inside functions and under `if TYPE_CHECKING:` count.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

LAYERS = {
    "looprl.types": 1,  # the records, and small utilities beside them
    "looprl.safe_json": 1,
    "looprl.files": 1,
    "looprl.console": 1,
    "looprl.algorithms": 2,  # tensor math
    "looprl.tools": 3,
    "looprl.sandbox": 3,
    "looprl.rendering": 3,
    "looprl.rubrics": 3,
    "looprl.kit": 3,
    "looprl.datasets": 3,
    "looprl.models": 3,
    "looprl.engines": 4,
    "looprl": 5,  # the author's namespace (`from looprl import Environment, ...`)
    "looprl.envs": 5,
    "looprl.judge": 5,
    "looprl.mcp": 5,
    "looprl.rollout": 6,
    "looprl.eval": 6,
    "looprl.trainer": 7,
    "looprl.sft": 7,
    "looprl.cli": 8,  # the faces
    "looprl.viewer": 8,
    "looprl.probe": 8,
    "looprl.testing": 8,
    "looprl.__main__": 8,
}
"""Package prefix -> layer, bottom up; the longest prefix of a module's name gives its layer."""


def module_name(path: Path) -> str:
    """The dotted name of a file under looprl/ (a package's `__init__.py` is the package)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


PATHS = {module_name(path): path for path in sorted((ROOT / "looprl").rglob("*.py"))}
SOURCES = {module: path.read_text(encoding="utf-8") for module, path in PATHS.items()}


@dataclass(frozen=True)
class Import:
    """One import of a looprl module by another: `names` taken from it (none for a module)."""

    importer: str
    target: str
    names: tuple[str, ...]
    line: int

    def __str__(self) -> str:
        return f"{self.importer}:{self.line} -> {self.target}"


def layer_of(module: str) -> int:
    """The layer of a looprl module, from the longest prefix of its name in `LAYERS`."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in LAYERS:
            return LAYERS[prefix]
    raise AssertionError(f"{module} has no layer: add its package to LAYERS in {__file__}")


def absolute(node: ast.ImportFrom, importer: str) -> str:
    """The module a `from ... import` reads, a relative one resolved against `importer`."""
    if node.level == 0:
        return node.module or ""
    package = importer.split(".")
    if PATHS[importer].name != "__init__.py":
        package.pop()
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def imports_in(importer: str, source: str) -> list[Import]:
    """Every looprl import in `source` (the text of `importer`), at any depth.

    `from looprl.x import y` where `looprl.x.y` is a module imports that module, not `looprl.x`.
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [Import(importer, a.name, (), node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = absolute(node, importer)
            subs = [f"{module}.{a.name}" for a in node.names]
            found += [Import(importer, sub, (), node.lineno) for sub in subs if sub in PATHS]
            names = tuple(
                a.name for a, sub in zip(node.names, subs, strict=True) if sub not in PATHS
            )
            if names:
                found.append(Import(importer, module, names, node.lineno))
    return [i for i in found if i.target.split(".")[0] == "looprl"]


def all_imports(sources: dict[str, str]) -> list[Import]:
    """The looprl imports of every module in `sources` (module name -> its text)."""
    return [i for module, source in sources.items() for i in imports_in(module, source)]


def upward(imports: list[Import]) -> list[str]:
    """Each import of a module from a higher layer than the importer's."""
    return [
        f"{i} (layer {layer_of(i.importer)} -> layer {layer_of(i.target)})"
        for i in imports
        if layer_of(i.target) > layer_of(i.importer)
    ]


def import_cycles(imports: list[Import]) -> list[str]:
    """Each set of modules that import one another, directly or around a loop (Tarjan's SCCs)."""
    edges: dict[str, set[str]] = {}
    for i in imports:
        if i.target != i.importer:
            edges.setdefault(i.importer, set()).add(i.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[str] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = sorted(stack[stack.index(node) :])
            del stack[stack.index(node) :]
            if len(component) > 1:
                found.append(" <-> ".join(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def private_names(imports: list[Import]) -> list[str]:
    """Each `_name` (not a dunder) one module imports from another."""
    return [
        f"{i.importer}:{i.line} imports {name} from {i.target}"
        for i in imports
        for name in i.names
        if name.startswith("_") and not name.startswith("__")
    ]


IMPORTS = all_imports(SOURCES)


def test_every_module_has_a_layer_and_every_import_resolves():
    assert not [prefix for prefix in LAYERS if prefix not in PATHS], "LAYERS names a lost package"
    for module in PATHS:
        layer_of(module)
    assert not [str(i) for i in IMPORTS if i.target not in PATHS], "imports of no looprl module"


def test_no_module_imports_from_a_layer_above_its_own():
    found = upward(IMPORTS)
    assert not found, "upward imports (move the name down, or the importer up):\n" + "\n".join(
        found
    )


def test_no_import_cycle_between_modules():
    found = import_cycles(IMPORTS)
    assert not found, "import cycles (lazy imports included):\n" + "\n".join(found)


def test_no_private_name_crosses_a_module_boundary():
    found = private_names(IMPORTS)
    assert not found, "private names imported (make them public, or move them):\n" + "\n".join(
        found
    )


def test_each_check_finds_a_planted_fault():
    """A lazy upward import, a lazy two-module cycle and a private name, added to the real sources:
    each check reports exactly the fault planted for it (beyond what it reports on the real code)."""
    sources = dict(SOURCES)
    sources["looprl.algorithms.kl"] += "\n\ndef f():\n    from looprl.viewer import synthetic\n"
    sources["looprl.rubrics"] += "\n\ndef g():\n    from looprl import kit\n"
    sources["looprl.kit"] += "\n\nfrom looprl.rubrics import _private\n"
    planted = all_imports(sources)
    kl_line = len(sources["looprl.algorithms.kl"].splitlines())
    kit_line = len(sources["looprl.kit"].splitlines())
    for check, fault in [
        (upward, f"looprl.algorithms.kl:{kl_line} -> looprl.viewer.synthetic (layer 2 -> layer 8)"),
        (import_cycles, "looprl.kit <-> looprl.rubrics"),
        (private_names, f"looprl.kit:{kit_line} imports _private from looprl.rubrics"),
    ]:
        assert [f for f in check(planted) if f not in check(IMPORTS)] == [fault]


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        ("a>b b>c", []),
        ("a>b b>a c>a", ["a <-> b"]),  # c only leads into the cycle
        ("a>b b>c c>a d>d", ["a <-> b <-> c"]),  # a module importing itself is no cycle
    ],
)
def test_cycles_around_a_loop_are_found(edges, expected):
    pairs = [edge.split(">") for edge in edges.split()]
    imports = [Import(importer, target, (), 1) for importer, target in pairs]
    assert import_cycles(imports) == expected
