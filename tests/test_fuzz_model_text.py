"""Fuzz: hostile model text through the parser, the rollout, every writer and the viewer's API.

Whatever a model writes (lone surrogate escapes, NaN, 5000-digit integers, 100k nested brackets,
near-miss tags, control characters), no exception escapes, malformed calls become tool errors,
and every file written is strict JSON in valid UTF-8 that reads back.
"""

from __future__ import annotations

import json
import random
import urllib.request
from pathlib import Path

import pytest
from helpers import model_text, random_json

from looprl.engines.scripted import ScriptedEngine
from looprl.envs.calculator import load_environment
from looprl.eval.summary import ResultsWriter, load_results, summarize, write_metadata
from looprl.rendering.parser import PARSE_ERROR_KINDS, HermesParser
from looprl.rendering.renderer import Renderer
from looprl.rollout.loop import RolloutConfig, run_groups
from looprl.safe_json import dumps, loads_strict, sanitize
from looprl.trainer.logger import save_rollouts
from looprl.types import EpisodeResult


def _strict_lines(path: Path) -> list[object]:
    """Every line of `path` as strict JSON read from strict UTF-8 (raises otherwise)."""
    text = path.read_bytes().decode("utf-8", errors="strict")
    return [loads_strict(line) for line in text.splitlines()]


def test_parser_never_raises_and_calls_are_clean() -> None:
    rng = random.Random(0)
    parser = HermesParser()
    kinds: set[str] = set()
    for _ in range(2000):
        turn = parser.parse(model_text(rng))
        for call in turn.calls:  # what reaches a tool is strict JSON in valid Unicode
            json.dumps(call.arguments, allow_nan=False).encode("utf-8")
            call.name.encode("utf-8")
        kinds.update(e.kind for e in turn.errors)
        assert all(e.message for e in turn.errors)
    assert kinds == set(PARSE_ERROR_KINDS)  # the generator reaches every kind of mistake


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ('{"name": "calculate", "arguments": {"expression": "\\ud800"}}', "lone surrogate"),
        ('{"name": "calculate", "arguments": {"expression": NaN}}', "NaN is not valid JSON"),
        ('{"name": "calculate", "arguments": {"x": Infinity}}', "Infinity is not valid JSON"),
        ('{"name": "calculate", "arguments": {"x": 1e999}}', "too large for a float"),
        ('{"name": "calculate", "arguments": {"x": ' + "9" * 5000 + "}}", "too many digits"),
        ('{"name": "calculate", "arguments": ' + "[" * 100_000 + "}", "nested too deeply"),
        ('{"name": "calculate", "arguments": {"x": ' + "[" * 40 + "]" * 40 + "}}", "deeper than"),
        ('{"name": "calculate", "arguments": "{\\"x\\": NaN}"}', "NaN is not valid JSON"),
    ],
)
def test_strict_json_breakers_are_malformed_calls(body: str, says: str) -> None:
    turn = HermesParser().parse(f"<tool_call>{body}</tool_call>")
    assert not turn.calls and len(turn.errors) == 1
    assert says in turn.errors[0].message
    assert len(turn.errors[0].message) < 400  # bounded, and no advice to change sys settings
    assert "set_int_max_str_digits" not in turn.errors[0].message


@pytest.mark.parametrize(
    "tag", ["<TOOL_CALL>", "< tool_call >", "<tool-call>", "<Tool_Call>", "<toolcall>"]
)
def test_near_miss_tags_are_told_not_taken_as_answers(tag: str) -> None:
    closing = tag.replace("<", "</", 1)
    turn = HermesParser().parse(f'{tag}{{"name": "calculate"}}{closing}')
    assert not turn.calls
    assert [e.kind for e in turn.errors] == ["misspelled_tag"]  # one report per spelling
    assert tag in turn.errors[0].message and "<tool_call>" in turn.errors[0].message


def test_exact_tags_and_prose_are_not_near_misses() -> None:
    turn = HermesParser().parse("I will call a tool call now. </tool_call> The answer is 4.")
    assert not turn.errors and not turn.calls


def test_safe_dumps_always_writes_strict_utf8() -> None:
    rng = random.Random(1)
    for _ in range(500):
        value = {
            "text": model_text(rng),
            "num": rng.choice([float("nan"), float("inf"), -0.0, 1.5]),
            rng.choice(["\ud800", "k", 3]): [model_text(rng)],
        }
        text = dumps(value)
        text.encode("utf-8")
        assert loads_strict(text) == sanitize(value)
    deep: list = []
    node = deep
    for _ in range(5000):
        node.append([])
        node = node[0]
    loads_strict(dumps({"deep": deep}))  # cut, not a RecursionError


async def _fuzz_episodes(tokenizer, n_tasks: int, seed: int) -> list[list[EpisodeResult]]:
    env = load_environment()
    rng = random.Random(seed)
    token_level = tokenizer is not None
    scripts = {}

    def reply(request) -> str:
        key = (request.messages[1].content, len(request.messages), request.sampling.seed)
        if key not in scripts:
            scripts[key] = model_text(rng, raw_surrogates=not token_level)
        return scripts[key]

    engine = ScriptedEngine(reply, tokenizer)
    renderer = Renderer(tokenizer, env.tool_schemas) if token_level else None
    tasks = env.get_tasks("eval", n_tasks, seed=seed)
    return await run_groups(
        env, engine, [(t, [0, 1]) for t in tasks], renderer=renderer, config=RolloutConfig()
    )


@pytest.mark.parametrize("level", ["message", "token"])
async def test_rollout_and_writers_survive_hostile_text(level, tiny_tokenizer, tmp_path) -> None:
    tokenizer = tiny_tokenizer if level == "token" else None
    groups = await _fuzz_episodes(tokenizer, n_tasks=40, seed=7)
    episodes = [ep for g in groups for ep in g]
    assert len(episodes) == 80
    # bad text is the model's mistake, never a broken episode
    assert not [ep.errors for ep in episodes if ep.rollout_error]
    assert sum(sum(ep.tool_errors.values()) for ep in episodes) > 0

    results = tmp_path / "eval" / "results.jsonl"
    writer = ResultsWriter(results)
    for group in groups:
        writer.write_group(group)
    summary = summarize(episodes, rollouts_per_task=2)
    write_metadata(tmp_path / "eval" / "metadata.json", {"summary": summary, "status": "finished"})
    save_rollouts(tmp_path / "train", 1, episodes)

    rows = _strict_lines(results)
    assert len(rows) == 80
    assert len(_strict_lines(tmp_path / "train" / "rollouts" / "step_000001.jsonl")) == 80
    loads_strict((tmp_path / "eval" / "metadata.json").read_bytes().decode("utf-8"))
    back, bad = load_results(results)
    assert bad == 0 and len(back) == 80
    assert [ep.messages[2].raw for ep in back][:3] == [
        json.loads(dumps(ep.messages[2].raw)) for ep in episodes[:3]
    ]


async def test_viewer_api_serves_hostile_episodes(tiny_tokenizer, tmp_path) -> None:
    from looprl.viewer.server import start_server

    groups = await _fuzz_episodes(None, n_tasks=10, seed=11)
    run = tmp_path / "eval-fuzz"
    writer = ResultsWriter(run / "results.jsonl")
    for group in groups:
        writer.write_group(group)
    write_metadata(run / "metadata.json", {"kind": "eval", "status": "finished"})
    server, url = start_server([run])
    try:

        def get(path: str) -> object:
            with urllib.request.urlopen(url.rstrip("/") + path, timeout=10) as resp:
                assert resp.status == 200
                return loads_strict(resp.read().decode("utf-8"))

        runs = get("/api/runs")["runs"]  # type: ignore[index]
        run_id = runs[0]["id"]
        page = get(f"/api/rollouts?run={run_id}&source=eval&step=all&limit=100")
        assert page["total"] == 20 and page["skipped"] == 0  # type: ignore[index]
        key = page["items"][0]["file"]  # type: ignore[index]
        for i in range(20):
            get(f"/api/episode?run={run_id}&file={key}&i={i}&tokens=1")
        get(f"/api/tasks?run={run_id}&q=")
        get(f"/api/config?run={run_id}")
    finally:
        server.close()


def test_random_json_generator_covers_breakers() -> None:
    rng = random.Random(3)
    texts = [random_json(rng) for _ in range(300)]
    assert any("NaN" in t for t in texts) and any("\\ud800" in t for t in texts)
