"""Environment packages: installed entry points load by name and show in `looprl env list`, a
name registered twice or an entry point that fails is one line naming the package and the fix,
and a folder loaded by path imports its own modules without seeing another folder's."""

from __future__ import annotations

import sys

import pytest
from helpers import write_dist_info

from looprl.cli.main import main
from looprl.envs.registry import available_environments, load_environment

ENV_SOURCE = '''"""{doc}"""

from looprl import Message, Rubric, SingleTurnEnv, Task


def says_the_number(episode):
    """1.0 when the reply is the task's number."""
    return float(episode.messages[-1].content.strip() == episode.task.answer)


def load_environment(size: int = 2):
    """{doc}"""
    tasks = [Task(f"n{{i}}", [Message(role="user", content=str(i))], str(i)) for i in range(size)]
    return SingleTurnEnv(
        name="{name}", rubric=Rubric([says_the_number]), train_tasks=tasks, eval_tasks=tasks
    )
'''


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A folder on `sys.path` standing for site-packages; its modules leave `sys.modules` after."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    before = set(sys.modules)
    yield folder
    for key in set(sys.modules) - before:
        if str(folder) in str(getattr(sys.modules[key], "__file__", None)):
            del sys.modules[key]


def _package(site, package, entry_points, source=ENV_SOURCE, version="1.0"):
    """Install `package` under `site`: its module `PACKAGE_env.py` (None: none) and its metadata."""
    module = package.replace("-", "_") + "_env"
    if source is not None:
        (site / f"{module}.py").write_text(source.format(doc="Repeat a number back.", name=package))
    write_dist_info(site, package, version, entry_points)


def test_an_installed_package_loads_by_name_and_env_list_shows_it(site, capsys, monkeypatch):
    entry_points = {
        "repeat": "numbers_game_env:load_environment",
        "repeat-module": "numbers_game_env",
    }
    _package(site, "numbers-game", entry_points, version="0.3.1")
    # the same package seen twice on sys.path (an editable install's metadata left in its source
    # folder) is one package, not a name registered twice
    copy = site.parent / "copy"
    write_dist_info(copy, "numbers-game", "0.3.1", entry_points)
    monkeypatch.syspath_prepend(str(copy))
    env = load_environment("repeat", size=3)
    assert env.name == "numbers-game" and len(env.get_tasks("eval", 3)) == 3
    assert load_environment("repeat-module").name == "numbers-game"  # a module: its function
    assert {"repeat", "repeat-module", "calculator"} <= set(available_environments())
    assert main(["env", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "version", "source", "description"]
    row = next(line for line in lines if line.startswith("repeat "))
    assert row.split()[:2] == ["repeat", "0.3.1"], row
    assert "entry point of package numbers-game" in row and row.endswith("Repeat a number back.")
    bundled = next(line for line in lines if line.startswith("calculator "))
    assert bundled.split()[2] == "bundled"


def test_env_flags_of_an_installed_environment_are_checked(site, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _package(site, "numbers-game", {"repeat": "numbers_game_env:load_environment"})
    assert main(["eval", "repeat", "--env.sise", "5"]) == 2
    err = capsys.readouterr().err
    assert "did you mean --env.size?" in err and len(err.strip().splitlines()) == 1


def test_a_name_registered_twice_is_refused_naming_the_packages(
    site, capsys, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    twin = "pkg_one_env:load_environment"
    _package(site, "pkg-one", {"twin": twin, "calculator": twin})
    _package(site, "pkg-two", {"twin": "pkg_two_env:load_environment"})
    with pytest.raises(ValueError) as info:
        load_environment("twin")
    assert str(info.value) == (
        "environment 'twin' is registered twice, by entry point of package pkg-one "
        "(pkg_one_env:load_environment) and entry point of package pkg-two "
        "(pkg_two_env:load_environment); rename the entry point in the pyproject.toml of "
        "pkg-one or pkg-two and reinstall it, or pip uninstall pkg-two"
    )
    with pytest.raises(ValueError, match=r"by bundled \(looprl.envs.calculator\) and entry point"):
        load_environment("calculator")  # a bundled name is not silently shadowed either
    assert main(["env", "list"]) == 0
    out = capsys.readouterr().out.splitlines()
    refused = [line for line in out if line.startswith("refused: ")]
    assert [line.split("'")[1] for line in refused] == ["calculator", "twin"]
    assert main(["eval", "twin"]) == 2
    err = capsys.readouterr().err.strip()
    assert "registered twice" in err and "rename the entry point" in err and "\n" not in err


@pytest.mark.parametrize(
    ("source", "target", "expected"),
    [
        (  # metadata left behind by a package whose files are gone
            None,
            "broken_env:load_environment",
            r"failed to import \(no module 'broken_env' is installed\); reinstall the package "
            r"\(pip install --force-reinstall broken, or pip install -e its folder\) or pip "
            "uninstall broken",
        ),
        (
            "raise RuntimeError('no data file')\n",
            "broken_env:load_environment",
            r"failed to import \(RuntimeError at .*broken_env.py:1: no data file\); fix the module",
        ),
        (
            "import not_a_dependency_anyone_has\n",
            "broken_env:load_environment",
            r"it imports 'not_a_dependency_anyone_has', which is not installed\); install the",
        ),
        (
            ENV_SOURCE,
            "broken_env:load_env",
            r"module broken_env has no 'load_env'; fix the entry point in the pyproject.toml of "
            "broken and reinstall it",
        ),
    ],
    ids=["files-gone", "raises", "missing-dependency", "wrong-function"],
)
def test_an_entry_point_that_fails_names_the_package_and_the_fix(
    site, capsys, tmp_path, monkeypatch, source, target, expected
):
    monkeypatch.chdir(tmp_path)
    _package(site, "broken", {"broken-env": target}, source=source)
    with pytest.raises(ValueError, match=r"^environment broken-env \(entry point .* of package "):
        load_environment("broken-env")
    with pytest.raises(ValueError, match=expected):
        load_environment("broken-env")
    assert main(["eval", "broken-env"]) == 2
    err = capsys.readouterr().err.strip()
    assert "package broken 1.0" in err and "\n" not in err


FOLDER_ENV = '''{import_rules}

from looprl import Message, Rubric, SingleTurnEnv, Task


def make_tasks(n, seed):
    """One task whose answer is the VALUE of the rules.py beside this file, read when asked."""
    return [Task("t0", [Message(role="user", content="the rule?")], str(rules.VALUE))]


def load_environment():
    return SingleTurnEnv(
        name="{name}", rubric=Rubric([lambda episode: 0.0]), train_tasks=make_tasks,
        eval_tasks=make_tasks,
    )
'''


def _folder(folder, main_file, value, import_rules="import rules"):
    """An environment folder: `main_file` imports `rules.py` beside it, whose VALUE is `value`."""
    folder.mkdir(parents=True)
    (folder / "rules.py").write_text(f"VALUE = {value}\n")
    text = FOLDER_ENV.format(import_rules=import_rules, name=folder.name)
    (folder / main_file).write_text(text)
    return str(folder)


def test_folders_load_with_their_own_modules_and_leak_none(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "rules", raising=False)
    path_before = list(sys.path)
    envs = [
        load_environment(_folder(tmp_path / "one", "environment.py", 1)),
        load_environment(_folder(tmp_path / "two", "__init__.py", 2, "from . import rules")),
        load_environment(_folder(tmp_path / "my-game", "my_game.py", 3)),  # verifiers layout
        load_environment(str(tmp_path / "one" / "environment.py")),  # the file, as before
    ]
    # tasks are made after loading: each environment still reads its own rules.py
    answers = [env.get_tasks("eval", 1)[0].answer for env in envs]
    assert answers == ["1", "2", "3", "1"]
    assert [env.name for env in envs] == ["one", "two", "my-game", "one"]
    assert "rules" not in sys.modules and sys.path == path_before


def test_a_folder_without_a_main_file_names_the_files_it_looks_for(tmp_path):
    (tmp_path / "empty-env").mkdir()
    (tmp_path / "empty-env" / "notes.py").write_text("")
    with pytest.raises(ValueError) as info:
        load_environment(str(tmp_path / "empty-env"))
    assert str(info.value) == (
        f"folder {tmp_path / 'empty-env'} holds none of __init__.py, environment.py, "
        "empty_env.py, empty_env_env.py; give the path of its .py file"
    )
