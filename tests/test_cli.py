"""Command-line edges: a user mistake is one line `error: what — fix` on stderr, exit 2, nothing left behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from looprl.cli.main import main


def _fails(capsys: pytest.CaptureFixture[str], argv: list[str], *needles: str) -> str:
    """Run `looprl ARGV`, expect exit 2 and one `error: ... — ...` line holding every needle."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and " — " in lines[0], err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run in an empty directory, so a stray `runs/` would show."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["eval", "calculator", "--model", "nosuch"], ["--model nosuch", "unknown model", "tiny"]),
        (["eval", "nosuchenv"], ["unknown environment 'nosuchenv'", "calculator"]),
        (["eval", "calculator", "--env.nosuch", "3"], ["--env.nosuch", "--env.max_turns"]),
        (["eval", "calculator", "--env.max_turn", "3"], ["did you mean --env.max_turns?"]),
        (["eval", "calculator", "--env.max_turns", "abc"], ["--env.max_turns abc", "int"]),
        (["eval", "calculator", "--envs.max_turns", "3"], ["did you mean --env.max_turns?"]),
        (["eval", "calculator", "--temprature", "1"], ["did you mean --temperature?"]),
        (["eval", "calculator", "--engine.kind", "sglang"], ["--engine.kind sglang", "torch"]),
        (["eval", "calculator", "--api-key-var", "LOOPRL_NO_SUCH_VAR"], ["LOOPRL_NO_SUCH_VAR"]),
        (["evl", "calculator"], ["unknown command 'evl'", "did you mean eval?"]),
        (["--verson"], ["--verson", "did you mean --version?"]),
        (["train", "--model.name", "nosuch"], ["--model.name nosuch", "unknown model"]),
        (["train", "--trainer.stepz", "3"], ["trainer.stepz", "did you mean --trainer.steps?"]),
        (["train", "--bogus"], ["--bogus", "looprl train --help"]),
        (["view", "x", "--env.a", "1"], ["takes no --section.field"]),
    ],
)
def test_user_mistakes_are_one_line_and_leave_nothing(capsys, in_tmp, argv, needles) -> None:
    _fails(capsys, argv, *needles)
    assert list(in_tmp.iterdir()) == []  # no run directory, no half-written file


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--temperature", "-1"), ("--top-p", "0"), ("--top-p", "1.5"), ("--max-tokens", "0")],
)
def test_bad_sampling_is_refused_before_any_work(capsys, in_tmp, monkeypatch, flag, value):
    import looprl.eval.run

    def no_work(*args, **kwargs):
        raise AssertionError("the evaluation started")

    monkeypatch.setattr(looprl.eval.run, "eval_job", no_work)
    _fails(capsys, ["eval", "calculator", flag, value], f"{flag} {value}")
    assert list(in_tmp.iterdir()) == []


def test_malformed_and_misspelled_toml_configs(capsys, tmp_path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[optim\nlr = 1\n")
    _fails(capsys, ["train", str(bad)], "not valid TOML", "line 1")
    typo = tmp_path / "typo.toml"
    typo.write_text("[trainer]\nstepz = 3\n")
    line = _fails(capsys, ["train", str(typo)], "did you mean trainer.steps?")
    assert "--trainer" not in line  # the TOML spelling, not a flag's
    _fails(capsys, ["train", str(tmp_path / "none.toml")], "does not exist")


def test_sft_data_mistakes_name_the_file_and_line(capsys, tmp_path) -> None:
    out = tmp_path / "model"
    _fails(capsys, ["sft", "--data", str(tmp_path / "missing.jsonl"), "--output", str(out)],
           "missing.jsonl does not exist", "--save-sft")  # fmt: skip
    data = tmp_path / "d.jsonl"
    good = (
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}'
    )
    data.write_text(good + "\n{not json\n")
    _fails(
        capsys, ["sft", "--data", str(data), "--output", str(out)], "d.jsonl:2", "not valid JSON"
    )
    data.write_text(good + "\n" + '{"messages": [{"role": "user", "content": "hi"}]}\n')
    _fails(capsys, ["sft", "--data", str(data), "--output", str(out)], "d.jsonl:2", "no assistant")
    data.write_text(good + "\n")
    _fails(capsys, ["sft", "--data", str(data), "--output", str(out), "--lr", "0"], "--lr 0")
    _fails(capsys, ["sft", "--data", str(data)], "--output is required")
    assert not out.exists()


def test_dead_server_is_found_before_any_episode(capsys, in_tmp) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    _fails(capsys, ["eval", "calculator", "-b", url, "-m", "served"], url, "start the")
    assert list(in_tmp.iterdir()) == []


def test_debug_shows_the_traceback_and_bugs_keep_theirs(tmp_path, monkeypatch) -> None:
    cmd = [sys.executable, "-m", "looprl", "eval", "nosuchenv"]
    env = {k: v for k, v in os.environ.items() if k != "LOOPRL_DEBUG"}
    plain = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr
    assert plain.stderr.count("\n") == 1 and plain.stderr.startswith("error: unknown environment")
    debug = subprocess.run(
        cmd, capture_output=True, text=True, env={**env, "LOOPRL_DEBUG": "1"}, cwd=tmp_path
    )
    assert debug.returncode == 2 and "Traceback" in debug.stderr
    assert debug.stderr.strip().splitlines()[-1].startswith("error: unknown environment")

    import looprl.eval.run

    def bug(*args, **kwargs):
        raise RuntimeError("a bug, not a user mistake")

    monkeypatch.setattr(looprl.eval.run, "eval_job", bug)
    with pytest.raises(RuntimeError, match="a bug"):  # not turned into a one-line exit 2
        main(["eval", "calculator", "-n", "1", "--output", str(tmp_path / "o")])


def test_busy_view_port_says_so(capsys, tmp_path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        _fails(capsys, ["view", str(tmp_path), "--port", str(port)], f"port {port}", "--port 0")


def test_version_env_list_and_aliases(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.startswith("looprl ")
    assert main(["env", "list"]) == 0
    out = capsys.readouterr().out
    for name, text in [("calculator", "safe `calculate` tool"), ("wordle", "five-letter"),
                       ("python_math", "sandboxed Python"),
                       ("number_anywhere", "appears anywhere")]:  # fmt: skip
        assert any(line.startswith(name) and text in line for line in out.splitlines()), out
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "-m STR, --model STR" in text and "-b STR, --base-url STR" in text
    assert "--env.KEY VALUE" in text and "--api-key-var" in text and "shell history" in text


def test_env_flags_of_a_function_entry_are_checked(capsys, in_tmp) -> None:
    """A registry entry `module:function` (the hackable toys) has its arguments read too."""
    assert main(["eval", "number_anywhere", "--env.hihg", "5"]) == 2
    err = capsys.readouterr().err
    assert "did you mean --env.high?" in err and len(err.strip().splitlines()) == 1
