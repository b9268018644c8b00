"""`looprl eval --policy MODULE:FN --save-sft FILE` feeds `looprl sft`; failed evals and API keys."""

from __future__ import annotations

import json

import pytest

from looprl.cli.main import main
from looprl.sft.train import read_conversations

POLICY = '''
import json
import re


def solve(messages):
    """Call `calculate` on the question, then copy its result."""
    results = [m.content for m in messages if m.role == "tool"]
    if results:
        return f"The answer is {results[-1]}."
    expr = re.search(r"What is (.+?)\\?", messages[-1].content).group(1)
    call = {"name": "calculate", "arguments": {"expression": expr}}
    return "<tool_call>\\n" + json.dumps(call) + "\\n</tool_call>"


def wrong(messages):
    return "The answer is -1."


def broken(messages):
    raise RuntimeError("the policy lost its server at http://example.invalid/" + "a" * 240 + "/end")
'''


@pytest.fixture
def policy_file(tmp_path):
    path = tmp_path / "my_policy.py"
    path.write_text(POLICY)
    return path


@pytest.mark.slow
def test_policy_eval_writes_traces_that_sft_reads(capsys, tmp_path, policy_file) -> None:
    out, traces = tmp_path / "ev", tmp_path / "warm" / "calc.jsonl"
    args = ["eval", "calculator", "--policy", f"{policy_file}:solve", "-n", "4", "-r", "1"]
    assert main([*args, "--output", str(out), "--save-sft", str(traces)]) == 0
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["status"] == "finished" and meta["summary"]["reward_mean"] == 1.0
    assert meta["model"] == f"{policy_file}:solve"
    rows = read_conversations(traces)
    assert len(rows) == 4  # every episode solved, every one kept
    roles = [m["role"] for m in rows[0]["messages"]]
    assert (
        roles[-3:] == ["assistant", "tool", "assistant"] and "tool_calls" in rows[0]["messages"][-3]
    )
    assert rows[0]["tools"][0]["function"]["name"] == "calculate"
    model = tmp_path / "sft-model"
    sft = ["sft", "--data", str(traces), "--output", str(model), "-m", "tiny", "--batch-size", "4"]
    assert main(sft) == 0
    assert (model / "config.json").is_file()
    assert "4 conversations" in capsys.readouterr().out


def test_unsolved_episodes_are_not_saved_as_traces(tmp_path, policy_file) -> None:
    traces = tmp_path / "t.jsonl"
    args = ["eval", "calculator", "--policy", f"{policy_file}:wrong", "-n", "3", "-r", "1"]
    assert main([*args, "--output", str(tmp_path / "ev"), "--save-sft", str(traces)]) == 0
    assert traces.read_text() == ""


def test_bad_policy_specs_are_one_line_errors(capsys, tmp_path, policy_file) -> None:
    for spec, needle in [
        ("nocolon", "not MODULE:FN"),
        ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz'"),
        (f"{policy_file}:nosuch", "has no function 'nosuch'"),
    ]:
        assert main(["eval", "calculator", "--policy", spec, "--output", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err and " — " in err, err
    assert not (tmp_path / "o").exists()


def test_an_eval_where_every_episode_errored_fails_and_says_why_in_full(
    capsys, tmp_path, policy_file
) -> None:
    out = tmp_path / "ev"
    args = ["eval", "calculator", "--policy", f"{policy_file}:broken", "-n", "2", "-r", "1"]
    assert main([*args, "--output", str(out)]) == 1
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["status"] == "failed"
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("error: evaluation failed: 2 of 2 episodes errored") and "--resume" in err
    whole = "http://example.invalid/" + "a" * 240 + "/end"
    assert whole in err and whole in captured.out  # the summary's 200-character cut is not all


def test_api_key_var_sends_the_key_from_the_environment(tmp_path, monkeypatch) -> None:
    from looprl.testing.fake_openai import FakeOpenAIServer

    monkeypatch.setenv("MY_LOOPRL_KEY", "sk-from-env")
    with FakeOpenAIServer(script=["The answer is 1."]) as srv:
        args = ["eval", "calculator", "-b", srv.base_url, "-m", "fake-model", "-n", "1", "-r", "1"]
        assert main([*args, "--api-key-var", "MY_LOOPRL_KEY", "--output", str(tmp_path / "o")]) == 0
    auth = {r.headers.get("authorization") for r in srv.requests}
    assert auth == {"Bearer sk-from-env"}  # the preflight and every completion
    assert [r.path for r in srv.requests][0] == "/v1/models"


def test_bundled_teacher_runs_as_a_policy(tmp_path) -> None:
    pytest.importorskip("looprl.sft.teachers")
    out = tmp_path / "ev"
    args = [
        "eval",
        "calculator",
        "--policy",
        "looprl.sft.teachers:calculator",
        "-n",
        "3",
        "-r",
        "1",
    ]
    assert main([*args, "--output", str(out)]) == 0
    assert json.loads((out / "metadata.json").read_text())["summary"]["reward_mean"] == 1.0
