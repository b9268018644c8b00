"""`import looprl` is the author's namespace: complete, cheap, and the only looprl import of every
bundled environment, of the tutorial, of the worked example and of the `looprl init` template."""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

import looprl
import looprl.kit
from looprl.cli.scaffold import scaffold

ROOT = Path(__file__).resolve().parents[1]
ENVS = ROOT / "looprl" / "envs"
NOT_ENVIRONMENTS = {
    "__init__",
    "base",
    "hints",
    "registry",
    "user",
}  # and the foreign/ adapters, one level down
AUTHOR_NAMES = [
    "Environment", "SingleTurnEnv", "MultiTurnEnv", "ToolEnv", "Limits", "StepOutcome",
    "Hidden", "make_tool", "tool_schema", "ToolError", "ToolReply", "Rubric", "JudgeRubric",
    "load_tasks", "train_eval_tasks", "load_environment", "Task", "Message", "EpisodeResult",
]  # fmt: skip


def outside_imports(source: str) -> list[str]:
    """The looprl modules `source` imports (at any depth) other than `looprl` itself and the
    environments' own helper modules (`looprl.envs.arithmetic`, not `looprl.envs.base`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if parts[0] != "looprl" or module == "looprl":
                continue
            helper = parts[:2] == ["looprl", "envs"] and len(parts) == 3
            if not (helper and parts[2] not in NOT_ENVIRONMENTS and parts[2] != "foreign"):
                found.append(f"line {node.lineno}: {module}")
    return found


def test_every_exported_name_resolves_once():
    assert len(looprl.__all__) == len(set(looprl.__all__))
    missing = [name for name in looprl.__all__ if getattr(looprl, name, None) is None]
    assert not missing, f"looprl.__all__ names what looprl does not define: {missing}"
    assert set(AUTHOR_NAMES) <= set(looprl.__all__), set(AUTHOR_NAMES) - set(looprl.__all__)


def test_the_whole_kit_is_exported():
    kit = [
        name
        for name, fn in inspect.getmembers(looprl.kit, inspect.isfunction)
        if fn.__module__ == "looprl.kit" and not name.startswith("_")
    ]
    assert kit and not set(kit) - set(looprl.__all__), set(kit) - set(looprl.__all__)


def test_import_looprl_pulls_neither_torch_nor_transformers():
    probe = "import sys, looprl; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "path",
    sorted(p for p in ENVS.glob("*.py") if p.stem not in NOT_ENVIRONMENTS),
    ids=lambda p: p.stem,
)
def test_bundled_environment_imports_from_looprl_only(path):
    assert outside_imports(path.read_text(encoding="utf-8")) == [], path.name


def test_tutorial_example_and_template_import_from_looprl_only(tmp_path):
    tutorial = re.findall(r"```python\n(.*?)```", (ROOT / "docs/environments.md").read_text(), re.S)
    sources = {
        "docs/environments.md (dates)": tutorial[0],
        "examples/unit_converter.py": (ROOT / "examples/unit_converter.py").read_text(),
        "looprl init letters": (scaffold("letters", tmp_path) / "letters_env.py").read_text(),
    }
    for where, source in sources.items():
        assert re.search(r"^(from looprl import |import looprl$)", source, re.M), where
        assert outside_imports(source) == [], where


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("from looprl import ToolEnv\nfrom looprl.envs.arithmetic import calculate", []),
        ("from looprl.kit import split_of", ["line 1: looprl.kit"]),
        ("from looprl.envs.base import ToolEnv", ["line 1: looprl.envs.base"]),
        ("def f():\n    import looprl.tools.schema", ["line 2: looprl.tools.schema"]),
        ("from looprl.envs.foreign import load_foreign", ["line 1: looprl.envs.foreign"]),
    ],
)
def test_the_check_flags_imports_around_the_namespace(source, found):
    assert outside_imports(source) == found
