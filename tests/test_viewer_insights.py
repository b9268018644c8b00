"""`looprl view` API: recomputed advantages, monitor trips, before/after evals, the held-out
eval grid, probe directories, list previews, and the tokenizer found from the run itself."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch

from looprl.algorithms.objective import group_advantages
from looprl.algorithms.presets import AlgorithmConfig
from looprl.viewer.synthetic import write_demo, write_probe, write_run


def get(url: str, path: str) -> Any:
    """GET a JSON API path."""
    with urllib.request.urlopen(url + path, timeout=30) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    """The synthetic demo folder: a run with monitors, its before/after evals and a probe."""
    return write_demo(tmp_path_factory.mktemp("demo") / "runs")


def test_advantage_is_recomputed_like_the_trainer(viewer_server, tmp_path):
    run = write_run(tmp_path / "r", steps=2, tasks=3, group=4, eval_every=2)
    url = viewer_server(run)
    for i in range(12):
        g = get(url, f"api/episode?run=r&file=train:1&i={i}")["group"]
        assert g["size"] == g["expected"] == 4 and g["index"] == i % 4 and g["first"] == i - i % 4
        lines = (run / "rollouts/step_000001.jsonl").read_text().splitlines()
        eps = [json.loads(x) for x in lines[g["first"] : g["first"] + 4]]
        assert g["rewards"] == [e["reward"] for e in eps]
        if eps[i % 4]["errors"]:  # left out of training, as samples_from_groups does
            assert g["advantage"] is None and "errors" in g["note"]
            continue
        usable = [e["reward"] for e in eps if not e["errors"]]
        want = group_advantages(AlgorithmConfig(), torch.tensor([usable])).advantages[0]
        assert g["advantage"] == pytest.approx(
            float(want[usable.index(eps[i % 4]["reward"])]), abs=1e-6
        )
        assert g["estimator"] == "group_normalized" and g["note"] == ""
    assert get(url, "api/episode?run=r&file=eval:2&i=0")["group"] is None  # eval episodes


def test_advantage_not_recomputed_from_a_partial_group_or_ppo(viewer_server, tmp_path):
    run = write_run(tmp_path / "r", steps=1, tasks=2, group=4, eval_every=5)
    path = run / "rollouts/step_000001.jsonl"
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:6]))  # save_rollouts=6
    url = viewer_server(run)
    g = get(url, "api/episode?run=r&file=train:1&i=5")["group"]
    assert g["advantage"] is None and "only 2 of this group's 4" in g["note"]
    cfg = json.loads((run / "config.json").read_text())
    cfg["algorithm"]["advantage"] = "gae"
    (run / "config.json").write_text(json.dumps(cfg))
    assert "GAE" in get(url, "api/episode?run=r&file=train:1&i=0")["group"]["note"]


def test_monitor_trips_and_before_after_evals(viewer_server, demo):
    runs = {r["id"]: r for r in get(viewer_server(demo), "api/runs")["runs"]}
    assert runs["probe-calc"]["kind"] == "probe" and runs["eval_before"]["kind"] == "eval"
    mons = runs["grpo"]["monitors"]
    assert [(m["name"], m["first_step"]) for m in mons] == [
        ("reward_up_eval_down", 14), ("length_blowup", 17)
    ]  # fmt: skip
    assert mons[0]["steps"] == [14, 16, 18, 20]
    anchors = {a["name"]: a for a in runs["grpo"]["anchors"]}
    assert (anchors["eval_before"]["label"], anchors["eval_before"]["step"]) == ("before", 0)
    assert (anchors["eval_after"]["label"], anchors["eval_after"]["step"]) == ("after", None)
    assert {"eval/reward", "eval/pass@1", "eval/gen_tokens"} <= set(
        anchors["eval_after"]["metrics"]
    )
    assert runs["eval_before"]["monitors"] == [] and runs["eval_before"]["anchors"] == []


def test_eval_grid_lists_held_out_tasks_across_steps(viewer_server, demo):
    grid = get(viewer_server(demo), "api/grid?run=grpo")
    assert [c["step"] for c in grid["columns"]] == [0, 5, 10, 15, 20]
    assert len(grid["tasks"]) == 6 and grid["tasks"][0]["task_id"] == "task-0000"
    cell = grid["tasks"][0]["cells"][1]
    lines = (demo / "grpo/eval/step_000005/results.jsonl").read_text().splitlines()
    assert cell["n"] == 1 and cell["mean"] == json.loads(lines[cell["i"][0]])["reward"]


def test_probe_directory_table_and_exploit_episodes(viewer_server, demo, tmp_path):
    url = viewer_server(demo)
    res = get(url, "api/probe?run=probe-calc")
    assert res["problem"] is None and res["probe"]["exploitable"] == ["many_candidates"]
    assert {r["verdict"] for r in res["probe"]["rows"]} == {"exploitable", "resisted", "errored"}
    assert res["episodes"]["many_candidates"] == [8, 9, 10, 11]
    items = get(url, "api/rollouts?run=probe-calc&exploit=tool_flood")["items"]
    assert len(items) == 4 and all(it["errors"] == ["rollout"] for it in items)
    bad = write_probe(tmp_path / "runs" / "bad")
    doc = json.loads((bad / "probe.json").read_text())
    doc["rows"][0]["verdict"] = "maybe"
    (bad / "probe.json").write_text(json.dumps(doc))
    res = get(viewer_server(bad), "api/probe?run=bad")
    assert res["probe"] is None and "verdict is 'maybe'" in res["problem"]


def test_rollout_list_previews_prompt_and_reply(viewer_server, demo):
    it = get(viewer_server(demo), "api/rollouts?run=grpo&step=3&limit=1")["items"][0]
    assert it["prompt"] == "What is 3 * 7 + 0?" and "The answer is" in it["preview"]


def test_tokenizer_found_from_the_run_wherever_view_starts(
    viewer_server, demo, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # not the folder the relative model path was written from
    url = viewer_server(demo)
    got = get(url, "api/episode?run=grpo&file=train:1&i=0&tokens=1")
    assert got["tokenizer"] == f"tokenizer from {demo / 'grpo' / 'final'}"
    assert "What is" in "".join(got["tokens"][0])
    ev = get(url, "api/episode?run=eval_before&file=eval:-&i=0&tokens=1")  # "start-model", relative
    assert ev["tokenizer"] == f"tokenizer from {demo / 'start-model'}"
