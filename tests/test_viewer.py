"""`looprl view` server and indexes: API answers, filters, paging, growth, malformed lines, read-only."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from looprl.viewer import main_args, start_server
from looprl.viewer.jsonl import EpisodeFile, Interner, MetricsFile, episode_summary
from looprl.viewer.synthetic import build_tokenizer, hf_encoder, write_run
from looprl.viewer.tokens import _FastDecoder, _HFDecoder, model_candidates


def get(url: str, path: str) -> Any:
    """GET a JSON API path; returns the decoded body (raises HTTPError on 4xx/5xx)."""
    with urllib.request.urlopen(url + path, timeout=10) as r:
        return json.loads(r.read())


def get_error(url: str, path: str) -> tuple[int, str]:
    """(status, error message) of a request that must fail."""
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(url + path, timeout=10)
    return exc.value.code, json.loads(exc.value.read())["error"]


@pytest.fixture
def server():
    """Start a viewer on the given paths; every server is closed at the end of the test."""
    started = []

    def start(*paths: Path) -> str:
        srv, url = start_server(list(paths))
        started.append(srv)
        return url

    yield start
    for srv in started:
        srv.close()


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory) -> Path:
    """A small offline tokenizer directory."""
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture
def run(tmp_path, tok_dir) -> Path:
    """A synthetic run (8 steps x 6 tasks x 4 rollouts) whose config names the tokenizer."""
    return write_run(
        tmp_path / "runA", steps=8, tasks=6, group=4, eval_every=4,
        encode=hf_encoder(tok_dir), model=str(tok_dir),
    )  # fmt: skip


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime_ns) of every file under root, to prove the viewer wrote nothing."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            st = os.stat(os.path.join(dirpath, f))
            out[os.path.join(dirpath, f)] = (st.st_size, st.st_mtime_ns)
    return out


def test_runs_metrics_and_config(server, run):
    url = server(run)
    runs = get(url, "api/runs")["runs"]
    assert [r["id"] for r in runs] == ["runA"] and runs[0]["kind"] == "train"
    keys = {f["key"] for f in runs[0]["files"]}
    assert {"train:1", "train:8", "eval:4", "eval:8"} <= keys and len(keys) == 10
    m = get(url, "api/metrics?run=runA&since=0")
    assert len(m["rows"]) == 8 and m["next"] == 8
    assert m["rows"][0]["step"] == 1 and "reward/mean" in m["rows"][0]
    assert "eval/accuracy" in m["rows"][3] and "eval/accuracy" not in m["rows"][0]
    assert get(url, "api/metrics?run=runA&since=6")["rows"][0]["step"] == 7
    assert get(url, "api/config?run=runA")["config"]["trainer"]["steps"] == 8


def test_rollout_filters_and_paging(server, run):
    url = server(run)
    base = "api/rollouts?run=runA&source=train"
    one = get(url, base + "&step=3&limit=100")
    assert one["total"] == 24 and one["complete"] and {i["step"] for i in one["items"]} == {3}
    everything = get(url, base + "&step=all&limit=500")
    assert everything["total"] == 8 * 24
    rows = everything["items"]
    pages = [get(url, f"{base}&step=all&offset={o}&limit=50")["items"] for o in range(0, 192, 50)]
    assert [(i["file"], i["i"]) for p in pages for i in p] == [(i["file"], i["i"]) for i in rows]
    env = get(url, base + "&step=all&env=arith&limit=500")
    assert env["total"] == sum(r["env"] == "arith" for r in rows) > 0
    assert set(env["envs"]) == {"arith", "calc"}
    high = get(url, base + "&step=all&min=1&limit=500")
    assert high["total"] == sum(r["reward"] >= 1 for r in rows) > 0
    low = get(url, base + "&step=all&max=0.5&limit=500")
    assert high["total"] + low["total"] == len(rows)
    errs = get(url, base + "&step=all&errors=errors&limit=500")
    assert errs["total"] == sum(bool(r["errors"]) for r in rows) > 0
    tool = get(url, base + "&step=all&errors=tool_errors&limit=500")["total"]
    clean = get(url, base + "&step=all&errors=clean&limit=500")["total"]
    assert tool > 0 and clean == sum(not r["errors"] and not r["tool_errors"] for r in rows)
    task = get(url, base + "&step=all&task=task-0002&limit=500")
    assert task["total"] == 8 * 4 and {i["task_id"] for i in task["items"]} == {"task-0002"}
    ev = get(url, "api/rollouts?run=runA&source=eval&step=all")
    assert ev["total"] == 2 * 6 and {i["step"] for i in ev["items"]} == {4, 8}


def test_episode_and_token_view(server, run, tok_dir):
    url = server(run)
    item = get(url, "api/rollouts?run=runA&step=2&limit=1")["items"][0]
    plain = get(url, f"api/episode?run=runA&file={item['file']}&i={item['i']}")
    ep = plain["episode"]
    assert "tokens" not in plain and ep["task"]["id"] == item["task_id"]
    assert [m["role"] for m in ep["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert ep["messages"][2]["tool_calls"][0]["name"] == "calculator"
    tok = get(url, f"api/episode?run=runA&file={item['file']}&i={item['i']}&tokens=1")
    pieces = tok["tokens"][0]
    traj = ep["trajectories"][0]
    assert len(pieces) == len(traj["token_ids"]) and str(tok_dir) in tok["tokenizer"]
    text = "".join(pieces)
    assert text.startswith("<|im_start|>system\n") and "<tool_call>" in text
    sampled = "".join(p for p, m in zip(pieces, traj["mask"], strict=True) if m)
    assert "The answer is" in sampled and "What is" not in sampled  # the prompt is not trained on


def test_token_view_without_tokenizer_shows_why(server, tmp_path):
    run = write_run(tmp_path / "r", steps=1, tasks=1, group=1, model="no-such-model-xyz")
    url = server(run)
    res = get(url, "api/episode?run=r&file=train:1&i=0&tokens=1")
    assert res["tokens"] == [None] and "no-such-model-xyz" in res["tokenizer"]
    assert model_candidates(run) == ["no-such-model-xyz"]


def test_growing_run_is_picked_up_live(server, tmp_path):
    run = write_run(tmp_path / "live", steps=2, tasks=2, group=2, eval_every=10)
    url = server(run)
    assert get(url, "api/metrics?run=live&since=0")["next"] == 2
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 3, "wall_time": 9.0, "reward/mean": 0.5}) + "\n")
        f.write('{"step": 4, "wall_time": 12.0, "reward/me')  # still being written
    m = get(url, "api/metrics?run=live&since=2")
    assert [r["step"] for r in m["rows"]] == [3] and m["notice"]["partial"]
    with open(run / "metrics.jsonl", "a") as f:
        f.write('an": 0.6}\n')
    assert [r["step"] for r in get(url, "api/metrics?run=live&since=3")["rows"]] == [4]
    src = (run / "rollouts" / "step_000002.jsonl").read_text()
    (run / "rollouts" / "step_000003.jsonl").write_text(src)
    keys = {f["key"] for f in get(url, "api/runs")["runs"][0]["files"]}
    assert "train:3" in keys
    assert get(url, "api/rollouts?run=live&step=all")["total"] == 3 * 4


def test_malformed_and_half_written_lines_are_skipped_with_notice(server, tmp_path):
    run = write_run(tmp_path / "bad", steps=1, tasks=2, group=2)
    path = run / "rollouts" / "step_000001.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    corrupt = lines[1].replace('"token_ids": [', '"token_ids": [,', 1)  # bad only in the middle
    tail = lines[3][: len(lines[3]) // 2]  # half-written, no newline
    path.write_text(lines[0] + "{not json\n" + corrupt + "\n" + lines[2] + "[1, 2]\n" + tail)
    with open(run / "metrics.jsonl", "a") as f:
        f.write("garbage\n" + json.dumps({"step": 2, "loss": float("nan"), "kl": 0.1}) + "\n")
    url = server(run)
    res = get(url, "api/rollouts?run=bad&step=1")
    assert res["total"] == 3  # lines 0, corrupt (fast-indexed), 2
    assert "malformed" in res["items"][1] and "could not read" in res["items"][1]["malformed"]
    status, msg = get_error(url, "api/episode?run=bad&file=train:1&i=1")
    assert status == 400 and msg
    info = get(url, "api/runs")["runs"][0]
    f1 = next(f for f in info["files"] if f["key"] == "train:1")
    assert f1["skipped"] == 2 and f1["partial"] and info["skipped_total"] == 3
    rows = get(url, "api/metrics?run=bad&since=0")["rows"]
    assert rows[-1] == {"step": 2.0, "kl": 0.1}  # NaN dropped, JSON stays valid
    assert info["metrics_notice"]["skipped_lines"] == [2]


def test_summary_fast_path_matches_full_parse():
    ep = json.loads(
        json.dumps(
            {
                "task": {"id": 7, "prompt": "hi", "env": "e", "info": {"reward": 5}},
                "messages": [{"role": "assistant", "content": '"reward": 9, "trajectories": ['}],
                "trajectories": [{"token_ids": [1], "mask": [1], "logprobs": [-0.1], "turns": [0]}],
                "reward": 0.25,
                "rewards": {},
                "errors": [],
                "tool_errors": {"timeout": 1},
                "truncated": True,
            }
        )
    )
    fast = episode_summary(json.dumps(ep).encode())
    compact = episode_summary(
        json.dumps(dict(reversed(ep.items())), separators=(",", ":")).encode()
    )
    assert fast == compact == ("7", "e", 0.25, 2 | 4)
    nan = dict(ep, reward=float("nan"), errors=[{"kind": "scoring"}])
    _, _, r, flags = episode_summary(json.dumps(nan).encode())
    assert math.isnan(r) and flags & 1
    with pytest.raises(ValueError):
        episode_summary(b'{"no": "task"}')


def test_index_resets_when_file_is_replaced(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text('{"step": 1}\n{"step": 2}\n')
    m = MetricsFile(p)
    assert m.refresh() and len(m.rows) == 2
    p.write_text('{"step": 9}\n')  # shorter: a new file
    assert m.refresh() and [r["step"] for r in m.rows] == [9.0]
    assert EpisodeFile(tmp_path / "missing.jsonl", Interner(), Interner()).refresh()


def test_folder_of_runs_eval_dir_and_read_only(server, tmp_path):
    root = tmp_path / "runs"
    write_run(root / "a", steps=2, tasks=2, group=2, eval_every=1)
    write_run(root / "b", steps=3, tasks=2, group=2, eval_every=10)
    ev = root / "evalx"
    ev.mkdir()
    (ev / "results.jsonl").write_text(
        (root / "a" / "eval" / "step_000001" / "results.jsonl").read_text()
    )
    meta = {"model": "not-a-model", "summary": {"accuracy": 0.5}}
    (ev / "metadata.json").write_text(json.dumps(meta))
    (root / "notes").mkdir()  # not a run
    before = snapshot(root)
    url = server(root)
    runs = get(url, "api/runs")["runs"]
    assert [(r["id"], r["kind"]) for r in runs] == [
        ("a", "train"),
        ("b", "train"),
        ("evalx", "eval"),
    ]
    assert runs[2]["summary"] == {"accuracy": 0.5}
    assert get(url, "api/rollouts?run=evalx")["total"] == 2
    assert get(url, "api/episode?run=evalx&file=eval:-&i=1&tokens=1")["episode"]["task"]["id"]
    write_run(root / "c", steps=1, tasks=1, group=1)
    assert "c" in [r["id"] for r in get(url, "api/runs")["runs"]]
    for rid in ("a", "b"):
        get(url, f"api/rollouts?run={rid}&step=all")
        get(url, f"api/metrics?run={rid}")
    after = snapshot(root)
    assert {k: v for k, v in after.items() if "/c/" not in k} == before


def test_errors_name_the_problem(server, run, tmp_path):
    url = server(run)
    status, msg = get_error(url, "api/metrics?run=nope")
    assert status == 404 and "runA" in msg
    status, msg = get_error(url, "api/rollouts?run=runA&offset=x")
    assert status == 400 and "offset" in msg
    status, msg = get_error(url, "api/rollouts?run=runA&errors=weird")
    assert status == 400 and "clean" in msg
    status, msg = get_error(url, "api/episode?run=runA&file=train:99&i=0")
    assert status == 404 and "train:99" in msg
    status, _ = get_error(url, "static/../server.py")
    assert status == 404
    with urllib.request.urlopen(url, timeout=10) as r:
        assert b"looprl view" in r.read()
    with pytest.raises(FileNotFoundError, match="not a directory"):
        start_server([tmp_path / "missing"])
    assert main_args([str(tmp_path / "missing")]) == 2


def test_module_entry_point_prints_url_and_serves(run):
    proc = subprocess.Popen(
        [sys.executable, "-m", "looprl.viewer", str(run)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(2)]
        assert "1 run(s): runA" in lines[0]
        url = re.search(r"http://127\.0\.0\.1:\d+/", lines[1])
        assert url, lines
        assert get(url.group(0), "api/runs")["runs"][0]["id"] == "runA"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=10)


def test_transformers_fallback_decodes_like_tokenizers(tok_dir):
    fast, hf = _FastDecoder(tok_dir / "tokenizer.json"), _HFDecoder(tok_dir)
    ids = hf_encoder(tok_dir)("<|im_start|>user\nWhat is 3 * 7?<|im_end|>")
    assert [hf.decode([i]) for i in ids] == [fast.decode([i]) for i in ids]
    assert "".join(fast.decode([i]) for i in ids) == "<|im_start|>user\nWhat is 3 * 7?<|im_end|>"
