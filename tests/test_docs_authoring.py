"""Tier 2: the authoring guide's example environment runs through `evaluate`, and the guide's claims hold."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
from pathlib import Path

import pytest

from looprl import tool_calls
from looprl.engines.scripted import ScriptedEngine
from looprl.envs.registry import load_environment
from looprl.eval.summary import evaluate, summarize
from looprl.rendering import Renderer
from looprl.rollout.loop import RolloutConfig, run_group
from looprl.sft.teachers import tool_call
from looprl.sft.train import examples_from_rows, read_conversations
from looprl.tools import ERROR_KINDS, ToolError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "unit_converter.py"
GUIDE = ROOT / "docs" / "authoring.md"


def _example():
    spec = importlib.util.spec_from_file_location("unit_converter", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _env(**kwargs):
    """The example as `looprl eval examples/unit_converter.py` loads it (by file path)."""
    return load_environment(str(EXAMPLE), **kwargs)


def test_scripted_policy_solves_the_example_through_evaluate(tiny_tokenizer):
    env = _env()
    tasks = env.get_tasks("eval", 6, seed=0)
    policy = _example().policy
    engine = ScriptedEngine(lambda request: policy(request.messages), tiny_tokenizer)
    renderer = Renderer(tiny_tokenizer, env.tool_schemas)
    episodes, _ = asyncio.run(
        evaluate(env, engine, tasks, rollouts_per_task=2, renderer=renderer, config=RolloutConfig())
    )
    assert len(episodes) == 12 and not any(ep.errors for ep in episodes)
    assert all(ep.reward == 1.0 and ep.rewards["lookups"] == 2.0 for ep in episodes)
    for ep in episodes:
        [traj] = ep.trajectories
        # tool output and prompt are attended to, never trained on: mask 1 only on sampled tokens
        sampled = sum(traj.mask)
        assert 0 < sampled < len(traj) and all(
            (lp != 0.0) == bool(m) for lp, m in zip(traj.logprobs, traj.mask, strict=True)
        )
    summary = summarize(episodes, rollouts_per_task=2)
    assert summary["reward_mean"] == 1.0


def _play(env, replies):
    engine = ScriptedEngine(replies)
    [ep] = asyncio.run(
        run_group(env, engine, env.get_tasks("train", 1, seed=0)[0], 1, renderer=None)
    )
    return ep


def test_tool_errors_of_their_own_kind_are_shown_and_counted():
    env = _env()
    ep = _play(
        env,
        [
            tool_call("lookup", {"unit": "furlong"})
            + tool_call("convert", {"value": 1, "from_unit": "m", "to_unit": "km"}),  # fmt: skip
            "The answer is 0.",
        ],
    )
    tool_messages = [m.content for m in ep.messages if m.role == "tool"]
    assert tool_messages[0].startswith("Error: no such unit 'furlong'; known units: mm")
    assert tool_messages[1] == "Error: look up m, km first"
    assert ep.tool_errors == {"not_found": 1, "not_looked_up": 1}
    assert [o.error_kind for o in ep.tool_outcomes] == ["not_found", "not_looked_up"]
    assert ep.rewards["own_errors"] == 2.0 and ep.reward == 0.0
    # kinds a tool raises are its own: the executor's kinds (used_tool, tool_call_validity) differ
    assert not {"not_found", "not_looked_up"} & set(ERROR_KINDS)


def test_tool_error_kind_must_be_an_identifier():
    assert ToolError("no such unit", kind="not_found").kind == "not_found"
    for bad in ("", "no such unit", "not found!"):
        with pytest.raises(ValueError, match="ToolError kind"):
            ToolError("no such unit", kind=bad)


def test_last_allowed_turn_runs_its_tools_but_drops_their_replies():
    env = _env(max_turns=1)
    ep = _play(env, [tool_call("lookup", {"unit": "km"})])
    assert ep.stop_reason == "max_turns" and ep.truncated
    assert ep.num_tool_calls == 1 and len(ep.tool_outcomes) == 1 and ep.tool_outcomes[0].ok
    assert [m.role for m in ep.messages][-1] == "assistant"  # the tool's reply was never added
    assert ep.state["known"] == {"km": 1000.0}  # but the tool ran


def test_num_tool_calls_counts_malformed_blocks_and_tool_calls_only_well_formed():
    env = _env()
    ep = _play(
        env,
        [
            '<tool_call>\n{"name": "lookup", "arguments": {"unit": "km"\n</tool_call>'
            + tool_call("lookup", {"unit": "m"}),
            "The answer is 1.",
        ],  # fmt: skip
    )
    assert ep.num_tool_calls == 2 and len(tool_calls(ep)) == 1
    assert sum(o.ok for o in ep.tool_outcomes) == 1
    assert ep.tool_errors == {"malformed_json": 1}


def test_guide_excerpts_are_copied_from_the_example():
    """Every ```python block of the guide headed `# examples/unit_converter.py` is in the file."""
    source = EXAMPLE.read_text(encoding="utf-8")
    blocks = re.findall(
        r"```python\n# examples/unit_converter\.py[^\n]*\n(.*?)```", GUIDE.read_text(), re.S
    )
    assert len(blocks) >= 3
    for block in blocks:
        for chunk in block.split("\n...\n"):
            assert chunk.strip() in source, chunk[:200]


def test_guide_sft_example_is_a_valid_row(tmp_path, tiny_tokenizer):
    [block] = re.findall(r"```json\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.S)
    data = tmp_path / "row.jsonl"
    data.write_text(json.dumps(json.loads(block)) + "\n", encoding="utf-8")
    rows = read_conversations(data)
    [example] = examples_from_rows(
        lambda tools: Renderer(tiny_tokenizer, tools), rows, "<|im_end|>"
    )
    assert 0 < sum(example.mask) < len(example.mask)
