"""`looprl init`: the scaffolded package loads, runs, registers its entry point and passes its tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib

import pytest
from helpers import check_token_invariants, run_episode, write_dist_info

from looprl.cli.main import main
from looprl.cli.scaffold import scaffold
from looprl.envs.registry import ENTRY_POINT_GROUP, load_environment


def test_scaffold_writes_a_package(tmp_path):
    root = scaffold("letter-count", tmp_path)
    assert root == tmp_path / "letter-count"
    names = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert names == [
        "README.md",
        "letter_count_env.py",
        "pyproject.toml",
        "tests/test_letter_count_env.py",
    ]
    meta = tomllib.loads((root / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"][ENTRY_POINT_GROUP] == {
        "letter-count": "letter_count_env:load_environment"
    }
    assert meta["tool"]["setuptools"]["py-modules"] == ["letter_count_env"]
    assert "looprl eval letter-count/letter_count_env.py" in (root / "README.md").read_text()
    for path in root.rglob("*.py"):
        compile(path.read_text(), str(path), "exec")


async def test_scaffolded_env_runs_from_its_file(tmp_path, tiny_tokenizer):
    root = scaffold("letters", tmp_path)
    env = load_environment(str(root / "letters_env.py"))
    assert env.name == "letters" and [s["function"]["name"] for s in env.tool_schemas] == [
        "count_letter"
    ]
    task = env.get_tasks("eval", 1)[0]
    _, letter, _, word, _ = task.prompt[-1].content.split("'")
    call = (
        "<tool_call>\n"
        + json.dumps({"name": "count_letter", "arguments": {"word": word, "letter": letter}})
        + "\n</tool_call>"
    )
    ep = await run_episode(env, task, [call, f"The answer is {task.answer}."], tiny_tokenizer)
    check_token_invariants(ep, env, tiny_tokenizer)
    assert ep.reward == 1.0 and ep.messages[-2].content == task.answer


def test_scaffolded_tests_pass(tmp_path):
    root = scaffold("letters", tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(root)],
        cwd=root, capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 passed" in proc.stdout


@pytest.fixture
def forget_letters_env():
    """`letters_env`, which a test imports by name, leaves `sys.modules` after it."""
    yield
    sys.modules.pop("letters_env", None)


def _listed_as_installed(capsys) -> bool:
    """`looprl env list` has a row `letters  0.1.0  entry point of package letters  ...`."""
    assert main(["env", "list"]) == 0
    rows = [line.split(maxsplit=2) for line in capsys.readouterr().out.splitlines()]
    return any(
        row[:2] == ["letters", "0.1.0"] and row[2].startswith("entry point of package letters ")
        for row in rows
        if len(row) == 3
    )


def test_the_scaffolded_entry_point_loads_by_name_once_installed(
    tmp_path, monkeypatch, capsys, forget_letters_env
):
    """Installed as its pyproject says (the metadata pip would write), the package loads by name;
    the folder itself loads by path too."""
    root = scaffold("letters", tmp_path)
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    write_dist_info(
        root, project["name"], project["version"], project["entry-points"][ENTRY_POINT_GROUP]
    )
    monkeypatch.syspath_prepend(str(root))
    assert load_environment("letters").name == "letters"
    assert _listed_as_installed(capsys)
    assert load_environment(str(root)).tool_schemas[0]["function"]["name"] == "count_letter"


@pytest.mark.slow
def test_pip_installs_the_scaffold_and_it_loads_by_name(
    tmp_path, monkeypatch, capsys, forget_letters_env
):
    """A real `pip install` (no network: no dependencies, no build isolation) into a folder."""
    root = scaffold("letters", tmp_path)
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    pip += ["--no-index", "--target", str(site), str(root)]
    subprocess.run(pip, check=True, capture_output=True, timeout=300)
    monkeypatch.syspath_prepend(str(site))
    env = load_environment("letters")
    assert env.name == "letters" and sys.modules["letters_env"].__file__.startswith(str(site))
    assert _listed_as_installed(capsys)


@pytest.mark.parametrize("name", ["Bad", "1abc", "a b", "json", "calculator", "class"])
def test_bad_names_are_refused(tmp_path, name):
    with pytest.raises(ValueError, match="choose another name|must start with"):
        scaffold(name, tmp_path)


def test_existing_folder_is_not_overwritten(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError, match="already exists"):
        scaffold("mine", tmp_path)
    assert (tmp_path / "mine" / "keep.txt").read_text() == "x"
