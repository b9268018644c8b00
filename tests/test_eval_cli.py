"""Tier 3: `looprl eval` end to end on the tiny model, `--resume` after an interruption, and an OpenAI server."""

from __future__ import annotations

import json

import pytest

from looprl.cli.main import main
from looprl.eval.summary import load_results

pytestmark = pytest.mark.slow


def test_eval_writes_results_and_metadata(tmp_path, capsys):
    out = tmp_path / "ev"
    assert (
        main(
            [
                "eval",
                "calculator",
                "--model",
                "tiny",
                "-n",
                "3",
                "-r",
                "2",
                "--output",
                str(out),
                "--max-tokens",
                "8",
            ]
        )
        == 0
    )
    eps, bad = load_results(out / "results.jsonl")
    assert len(eps) == 6 and bad == 0
    ep = eps[0]
    seg = ep.trajectories[0]
    assert len(seg.token_ids) == len(seg.mask) == len(seg.logprobs) > 0 and seg.num_sampled > 0
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["status"] == "finished" and meta["summary"]["episodes"] == 6
    assert "pass@2" in meta["summary"]["pass_at_k"] and meta["sampling"]["max_tokens"] == 8
    printed = capsys.readouterr().out
    assert "pass@2" in printed and "generated tokens / s" in printed


def test_eval_resume_skips_finished_groups(tmp_path):
    out = tmp_path / "ev"
    args = [
        "eval",
        "calculator",
        "--model",
        "tiny",
        "-n",
        "4",
        "-r",
        "2",
        "--output",
        str(out),
        "--max-tokens",
        "6",
    ]
    assert main(args) == 0
    lines = (out / "results.jsonl").read_text().splitlines()
    # simulate a run killed after two groups, the last write cut in half
    (out / "results.jsonl").write_text("\n".join(lines[:4]) + "\n" + lines[4][:50])
    assert main([*args, "--resume"]) == 0
    eps, bad = load_results(out / "results.jsonl")
    assert bad == 0 and len(eps) == 8
    assert [json.loads(x)["task"]["id"] for x in lines[:4]] == [e.task.id for e in eps[:4]]
    assert len({(e.task.id, e.rollout_index) for e in eps}) == 8


def test_eval_refuses_to_overwrite_and_rejects_bad_env(tmp_path, capsys):
    out = tmp_path / "ev"
    out.mkdir()
    (out / "results.jsonl").write_text("x\n")
    args = ["--model", "tiny", "-n", "1", "-r", "1", "--output"]
    assert main(["eval", "calculator", *args, str(out)]) == 2
    assert "--resume" in capsys.readouterr().err
    assert main(["eval", "nope_env", *args, str(tmp_path / "x")]) == 2
    assert "unknown environment" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_eval_against_openai_compatible_server(tmp_path):
    from looprl.testing.fake_openai import FakeOpenAIServer, FakeReply

    def script(req):
        if any(m["role"] == "tool" for m in req["messages"]):
            return FakeReply(text=f"The answer is {req['messages'][-1]['content']}.")
        expr = req["messages"][-1]["content"].removeprefix("What is ").removesuffix("?")
        return FakeReply(tool_calls=[{"name": "calculate", "arguments": {"expression": expr}}])

    with FakeOpenAIServer(script=script) as srv:
        out = tmp_path / "ev"
        assert (
            main(
                [
                    "eval",
                    "calculator",
                    "--base-url",
                    srv.base_url,
                    "--model",
                    "fake-model",
                    "-n",
                    "3",
                    "-r",
                    "1",
                    "--output",
                    str(out),
                ]
            )
            == 0
        )
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["summary"]["reward_mean"] == 1.0


def test_eval_concurrency_reaches_the_server(tmp_path):
    """`--concurrency C -r R` lets C x R requests wait on the server at once (the engine's cap follows)."""
    from looprl.testing.fake_openai import FakeOpenAIServer

    with FakeOpenAIServer(script=["The answer is 1."], delay=0.3) as srv:
        args = ["eval", "calculator", "--base-url", srv.base_url, "--model", "fake-model"]
        args += ["-n", "20", "-r", "2", "--concurrency", "20", "--output", str(tmp_path / "c")]
        assert main(args) == 0
        assert srv.max_in_flight > 32  # the engine's default cap before the flag reached it
