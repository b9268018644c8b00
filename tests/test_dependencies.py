"""pyproject.toml against the code: every import is declared, every dependency is used, extras are lazy."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

# Declared runtime dependencies that looprl never imports itself, and why each is needed.
NOT_IMPORTED = {
    "jinja2": "transformers renders chat templates with it but does not require it",
    "sympy": "the python sandbox preloads it for model-written code",
    "tensorboard": "the writer behind torch.utils.tensorboard",
}


def dist_name(requirement: str) -> str:
    """The normalised distribution name of a requirement string (PEP 503)."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def module_dists() -> dict[str, set[str]]:
    """Top-level module name -> the normalised names of the installed distributions providing it."""
    out: dict[str, set[str]] = {}
    for module, dists in importlib.metadata.packages_distributions().items():
        out[module] = {dist_name(d) for d in dists}
    return out


OTHER_INTERPRETERS = {"looprl/envs/foreign/_verifiers_v1_worker.py"}
"""Scripts that run in a venv of their own (verifiers 0.4's), never imported by looprl."""


def looprl_imports() -> dict[str, list[tuple[str, bool]]]:
    """Third-party top-level modules imported by looprl -> [(file:line, at module level?)]."""
    found: dict[str, list[tuple[str, bool]]] = {}
    for path in sorted((ROOT / "looprl").rglob("*.py")):
        if path.relative_to(ROOT).as_posix() in OTHER_INTERPRETERS:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top_level = {id(node) for node in _module_level(tree.body)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                root = name.split(".")[0]
                if root in sys.stdlib_module_names or root == "looprl":
                    continue
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                found.setdefault(root, []).append((where, id(node) in top_level))
    return found


def _module_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """Statements run on import: the body, and the bodies of its if/try blocks (not functions)."""
    out: list[ast.stmt] = []
    for node in body:
        out.append(node)
        if isinstance(node, ast.If | ast.Try):
            nested = node.body + node.orelse
            if isinstance(node, ast.Try):
                nested += node.finalbody + [s for h in node.handlers for s in h.body]
            out += _module_level(nested)
    return out


def test_torch_is_a_range_not_a_pin() -> None:
    torch = [r for r in PYPROJECT["dependencies"] if dist_name(r) == "torch"]
    assert len(torch) == 1 and "==" not in torch[0] and ">=" in torch[0], torch


def test_every_import_is_declared_and_extras_are_imported_lazily() -> None:
    core = {dist_name(r) for r in PYPROJECT["dependencies"]}
    extras = {
        dist_name(r): extra
        for extra, reqs in PYPROJECT["optional-dependencies"].items()
        if extra != "dev"
        for r in reqs
    }
    providers = module_dists()
    problems = []
    for module, sites in looprl_imports().items():
        # an extra not installed here is matched by name (module `openenv`, dist `openenv-core`)
        named = {
            d for d in extras if d == dist_name(module) or d.startswith(dist_name(module) + "-")
        }
        dists = providers.get(module, named)
        if not dists:
            problems.append(f"{module} (at {sites[0][0]}) is not installed nor declared")
        elif dists & core:
            continue
        elif dists & extras.keys():
            eager = [where for where, top in sites if top]
            if eager:
                problems.append(f"{module} is in an extra but imported on import at {eager}")
        else:
            problems.append(f"{module} (at {sites[0][0]}) comes from {dists}: not declared")
    assert not problems, problems


def test_every_declared_dependency_is_used() -> None:
    """A dependency nobody imports (sniffio, accelerate before) is either needed for a reason
    named in NOT_IMPORTED or removed."""
    providers = module_dists()
    imported = {d for module in looprl_imports() for d in providers.get(module, ())}
    unused = [
        r
        for r in PYPROJECT["dependencies"]
        if dist_name(r) not in imported and dist_name(r) not in NOT_IMPORTED
    ]
    assert not unused, f"declared but never imported by looprl: {unused}"
    stale = [name for name in NOT_IMPORTED if name in imported]
    assert not stale, f"imported after all; drop them from NOT_IMPORTED: {stale}"


def test_smollm2_extra_is_what_the_gguf_conversion_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The extra lists the packages the loader checks, and a missing one names the extra."""
    from looprl.models import loading

    extra = {dist_name(r) for r in PYPROJECT["optional-dependencies"][loading.SMOLLM2_EXTRA]}
    assert extra == set(loading.SMOLLM2_CONVERTERS)
    real = loading.importlib.util.find_spec
    monkeypatch.setattr(
        loading.importlib.util,
        "find_spec",
        lambda name: None if name == "accelerate" else real(name),
    )
    with pytest.raises(ImportError, match=r"\['accelerate'\].*pip install -e '\.\[smollm2\]'"):
        loading._require_converters()
