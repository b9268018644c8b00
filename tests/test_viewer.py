"""`looprl view` server and indexes: API answers, filters, paging, growth, malformed lines, read-only."""

from __future__ import annotations

import http.client
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from looprl.viewer import main_args, start_server
from looprl.viewer.insights import FINAL_QUIET_S, IDLE_S, run_status
from looprl.viewer.jsonl import EpisodeFile, Interner, MetricsFile, episode_summary
from looprl.viewer.server import host_allowed
from looprl.viewer.synthetic import build_tokenizer, hf_encoder, write_hostile_run, write_run
from looprl.viewer.tokens import FastDecoder, HFDecoder, model_candidates


def get(url: str, path: str) -> Any:
    """GET a JSON API path; returns the decoded body (raises HTTPError on 4xx/5xx)."""
    with urllib.request.urlopen(url + path, timeout=10) as r:
        return json.loads(r.read())


def get_error(url: str, path: str) -> tuple[int, str]:
    """(status, error message) of a request that must fail."""
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(url + path, timeout=10)
    return exc.value.code, json.loads(exc.value.read())["error"]


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


def test_runs_metrics_and_config(viewer_server, run):
    url = viewer_server(run)
    runs = get(url, "api/runs")["runs"]
    assert [r["id"] for r in runs] == ["runA"] and runs[0]["kind"] == "train"
    keys = {f["key"] for f in runs[0]["files"]}
    assert {"train:1", "train:8", "eval:4", "eval:8"} <= keys and len(keys) == 10
    m = get(url, "api/metrics?run=runA&since=0")
    assert len(m["rows"]) == 8 and m["next"] == 8
    assert m["rows"][0]["step"] == 1 and "reward/mean" in m["rows"][0]
    assert "eval/pass@1" in m["rows"][3] and "eval/pass@1" not in m["rows"][0]
    assert get(url, "api/metrics?run=runA&since=6")["rows"][0]["step"] == 7
    assert get(url, "api/config?run=runA")["config"]["config"]["trainer"]["steps"] == 8


def test_run_status_says_live_only_while_the_run_is_written(tmp_path):
    """summary.json's status wins; final/ and a quiet metrics.jsonl mean finished; a long quiet
    without either is idle; otherwise the run is live."""
    run = write_run(tmp_path / "r", steps=2, tasks=2, group=2, eval_every=2)
    written = (run / "metrics.jsonl").stat().st_mtime
    assert run_status(run, now=written + 1)["status"] == "live"
    assert run_status(run, now=written + IDLE_S + 1)["status"] == "idle"
    (run / "final").mkdir()
    assert run_status(run, now=written + 1)["status"] == "live"  # metrics may still grow
    assert run_status(run, now=written + FINAL_QUIET_S + 1)["status"] == "finished"
    (run / "summary.json").write_text(json.dumps({"status": "failed", "error": "CUDA OOM"}))
    assert run_status(run, now=written + 1) == {"status": "failed", "why": "summary.json: CUDA OOM"}


def test_api_runs_reports_each_runs_status(viewer_server, tmp_path):
    root = tmp_path / "runs"
    write_run(root / "going", steps=2, tasks=2, group=2, eval_every=2)
    stopped = write_run(root / "stopped", steps=2, tasks=2, group=2, eval_every=2)
    (stopped / "summary.json").write_text(json.dumps({"status": "stopped early", "error": None}))
    ev = root / "ev"
    ev.mkdir()
    (ev / "results.jsonl").write_text("")
    (ev / "metadata.json").write_text(json.dumps({"status": "interrupted"}))
    runs = {r["id"]: r for r in get(viewer_server(root), "api/runs")["runs"]}
    assert {k: r["status"] for k, r in runs.items()} == {
        "ev": "interrupted", "going": "live", "stopped": "stopped early",
    }  # fmt: skip
    assert runs["stopped"]["why"] == "summary.json"


def test_rollout_filters_and_paging(viewer_server, run):
    url = viewer_server(run)
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


def test_episode_and_token_view(viewer_server, run, tok_dir):
    url = viewer_server(run, tokenizer=str(tok_dir))  # outside the run: only as --tokenizer
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
    assert len(pieces) == len(traj["token_ids"])
    assert tok["tokenizer"] == f"tokenizer from --tokenizer {tok_dir}"
    text = "".join(pieces)
    assert text.startswith("<|im_start|>system\n") and "<tool_call>" in text
    sampled = "".join(p for p, m in zip(pieces, traj["mask"], strict=True) if m)
    assert "The answer is" in sampled and "What is" not in sampled  # the prompt is not trained on


def test_token_view_without_tokenizer_shows_why(viewer_server, tmp_path):
    run = write_run(tmp_path / "r", steps=1, tasks=1, group=1, model="no-such-model-xyz")
    url = viewer_server(run)
    res = get(url, "api/episode?run=r&file=train:1&i=0&tokens=1")
    assert res["tokens"] == [None] and "no-such-model-xyz" in res["tokenizer"]
    assert model_candidates(run) == ["no-such-model-xyz"]


def test_growing_run_is_picked_up_live(viewer_server, tmp_path):
    run = write_run(tmp_path / "live", steps=2, tasks=2, group=2, eval_every=10)
    url = viewer_server(run)
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


def test_malformed_and_half_written_lines_are_skipped_with_notice(viewer_server, tmp_path):
    run = write_run(tmp_path / "bad", steps=1, tasks=2, group=2)
    path = run / "rollouts" / "step_000001.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    corrupt = lines[1].replace('"token_ids": [', '"token_ids": [,', 1)  # bad only in the middle
    tail = lines[3][: len(lines[3]) // 2]  # half-written, no newline
    path.write_text(lines[0] + "{not json\n" + corrupt + "\n" + lines[2] + "[1, 2]\n" + tail)
    with open(run / "metrics.jsonl", "a") as f:
        row = {"step": 2, "loss/total": float("nan"), "policy/kl": 0.1}
        f.write("garbage\n" + json.dumps(row) + "\n")
    url = viewer_server(run)
    res = get(url, "api/rollouts?run=bad&step=1")
    # the corrupt middle of line 3 passes the head-and-tail index and is found when listed
    assert res["total"] == 2 and [i["i"] for i in res["items"]] == [0, 2]
    assert res["skipped"] == 3  # lines 2, 3 and 6
    status, msg = get_error(url, "api/episode?run=bad&file=train:1&i=1")
    assert status == 400 and "line 3 of step_000001.jsonl is not a valid episode" in msg
    info = get(url, "api/runs")["runs"][0]
    f1 = next(f for f in info["files"] if f["key"] == "train:1")
    assert f1["skipped"] == 3 and f1["partial"] and info["skipped_total"] == 4
    assert f1["episodes_indexed"] == 2
    rows = get(url, "api/metrics?run=bad&since=0")["rows"]
    assert rows[-1] == {"step": 2.0, "policy/kl": 0.1}  # NaN dropped, JSON stays valid
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


def test_folder_of_runs_eval_dir_and_read_only(viewer_server, tmp_path):
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
    url = viewer_server(root)
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


def test_a_run_written_before_the_metric_namespaces_opens_with_the_new_names(
    viewer_server, tmp_path
):
    """The same run written with the old bare names (`kl`, `loss`, `turns`, ...) and with the
    namespaced ones: the viewer serves the same rows and monitor trips, and it plots."""
    shape = {"steps": 6, "tasks": 2, "group": 2, "eval_every": 3, "monitors": {"kl_spike": 4}}
    new = write_run(tmp_path / "new", **shape)
    old = write_run(tmp_path / "old", **shape, old_names=True)
    stored = json.loads((old / "metrics.jsonl").read_text().splitlines()[0])
    assert {"kl", "loss", "tool_calls", "rollout_errors"} <= set(stored)
    assert not any(k.startswith(("policy/", "loss/", "rollout/")) for k in stored)
    url = viewer_server(tmp_path)
    runs = {r["id"]: r for r in get(url, "api/runs")["runs"]}
    assert runs["old"]["metric_rows"] == runs["new"]["metric_rows"] == 6
    assert runs["old"]["monitors"] == runs["new"]["monitors"] != []
    rows = get(url, "api/metrics?run=old&since=0")["rows"]
    assert rows == get(url, "api/metrics?run=new&since=0")["rows"]
    assert {"policy/kl", "loss/total", "rollout/tool_calls", "rollout/errors"} <= set(rows[0])
    assert not {"kl", "loss", "tool_calls"} & set(rows[0])
    from looprl.trainer.logger import read_metrics
    from looprl.trainer.plots import plot_panels, plot_run

    panels = [plot_panels(read_metrics(d / "metrics.jsonl")) for d in (old, new)]
    assert panels[0] == panels[1] and "KL to reference" in [p.title for p in panels[0]]
    height = [int.from_bytes(plot_run(d).read_bytes()[20:24], "big") for d in (old, new)]
    assert height[0] == height[1]  # PNG IHDR height: the same panels, so the same layout


def test_errors_name_the_problem(viewer_server, run, tmp_path):
    url = viewer_server(run)
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
    fast, hf = FastDecoder(tok_dir / "tokenizer.json"), HFDecoder(tok_dir)
    ids = hf_encoder(tok_dir)("<|im_start|>user\nWhat is 3 * 7?<|im_end|>")
    assert [hf.decode([i]) for i in ids] == [fast.decode([i]) for i in ids]
    assert "".join(fast.decode([i]) for i in ids) == "<|im_start|>user\nWhat is 3 * 7?<|im_end|>"


# --- hostile run directories: fields are data, never markup --------------------------------------

PAYLOAD = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'
HOSTILE_DIR = "run <img src=x onerror=window.__xss=3>"  # a directory name cannot hold "/"


def test_hostile_fields_come_back_as_data(viewer_server, tmp_path):
    root = tmp_path / "runs"
    write_hostile_run(root / HOSTILE_DIR, PAYLOAD)
    ev = root / f"eval {HOSTILE_DIR}"
    ev.mkdir()
    (ev / "results.jsonl").write_bytes(
        (root / HOSTILE_DIR / "rollouts" / "step_000001.jsonl").read_bytes()
    )
    (ev / "metadata.json").write_text(json.dumps({"summary": {PAYLOAD: PAYLOAD}}))
    url = viewer_server(root)
    runs = get(url, "api/runs")["runs"]
    assert [r["name"] for r in runs] == [f"eval {HOSTILE_DIR}", HOSTILE_DIR]
    assert runs[0]["summary"] == {PAYLOAD: PAYLOAD} and runs[1]["skipped_total"] == 0
    rid = urllib.parse.quote(runs[1]["id"])
    rows = get(url, f"api/metrics?run={rid}")["rows"]
    assert rows[0] == {"step": 1, f"{PAYLOAD}/mean": 0.1, PAYLOAD: 0.2}
    assert get(url, f"api/config?run={rid}")["config"]["note"] == PAYLOAD
    res = get(url, f"api/rollouts?run={rid}&step=all")
    assert res["total"] == 2 and res["skipped"] == 0 and res["envs"] == [PAYLOAD]
    item = res["items"][0]
    assert item["task_id"] == f"{PAYLOAD} task-0" and item["env"] == PAYLOAD
    assert item["errors"] == [PAYLOAD] and PAYLOAD in item["preview"]
    ep = get(url, f"api/episode?run={rid}&file=train:1&i=0")["episode"]
    assert ep["messages"][2]["tool_calls"][0]["name"] == PAYLOAD
    assert ep["task"]["info"] == {PAYLOAD: PAYLOAD} and ep["stop_reason"] == PAYLOAD
    q = urllib.parse.quote(PAYLOAD[:10])
    assert get(url, f"api/tasks?run={rid}&q={q}")["tasks"] == [
        f"{PAYLOAD} task-{n}" for n in (0, 1)
    ]


def test_static_code_never_parses_html():
    """The page sets text, never HTML: no DOM call that parses a string as markup."""
    static = Path(__file__).parents[1] / "looprl" / "viewer" / "static"
    sinks = re.compile(
        r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|DOMParser|"
        r"createContextualFragment|srcdoc|\beval\(|new Function"
    )
    found = [
        f"{p.name}:{n}: {line.strip()}"
        for p in sorted(static.glob("*.js"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if sinks.search(line)
    ]
    assert not found, found


def test_pages_carry_security_headers(viewer_server, run):
    url = viewer_server(run)
    for path in ("", "static/app.js", "api/runs"):
        with urllib.request.urlopen(url + path, timeout=10) as r:
            assert "script-src 'self'" in r.headers["Content-Security-Policy"]
            assert r.headers["X-Content-Type-Options"] == "nosniff"


# --- the Host check against DNS rebinding ---------------------------------------------------------


def get_with_host(url: str, path: str, host: str) -> tuple[int, Any]:
    """(status, JSON body) of a GET sent with the given Host header."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=10)
    try:
        conn.putrequest("GET", "/" + path, skip_host=True)
        conn.putheader("Host", host)
        conn.endheaders()
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def test_host_header_must_name_this_server(viewer_server, run):
    url = viewer_server(run)
    port = urllib.parse.urlsplit(url).port
    for host in ("evil.example", f"evil.example:{port}", f"127.0.0.1.evil.example:{port}", ""):
        status, body = get_with_host(url, "api/runs", host)
        assert status == 403 and "DNS rebinding" in body["error"], host
    status, body = get_with_host(url, "", "evil.example")  # the page too, not only the APIs
    assert status == 403
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}"):
        status, body = get_with_host(url, "api/runs", host)
        assert status == 200 and body["runs"][0]["id"] == "runA", host


def test_host_allowed_follows_the_bound_address():
    assert host_allowed("LOCALHOST:8080", "127.0.0.1")
    assert host_allowed("localhost:9000", "127.0.0.1")  # an ssh -L tunnel on another port
    assert not host_allowed("localhost.evil.example", "127.0.0.1")
    assert not host_allowed("localhost@evil.example", "127.0.0.1")
    assert not host_allowed(None, "127.0.0.1")
    assert host_allowed("gpu-box.lan:8765", "gpu-box.lan")  # an explicit --host is allowed
    assert not host_allowed("other.lan:8765", "gpu-box.lan")
    assert not host_allowed("10.0.0.5:8765", "gpu-box.lan")
    assert host_allowed("10.0.0.5:8765", "0.0.0.0")  # all interfaces: any IP address
    assert host_allowed("[fe80::1]:8765", "0.0.0.0")
    assert not host_allowed("evil.example:8765", "0.0.0.0")


# --- malformed rows: a fuzz over every endpoint ----------------------------------------------------

NAN, INF = float("nan"), float("inf")


def nested(depth: int) -> Any:
    """A list nested `depth` levels deep."""
    x: Any = 0
    for _ in range(depth):
        x = [x]
    return x


# (path, value): set that field of a valid episode. BAD edits break the shape the page relies on
# (the line must be skipped and counted); OK edits are odd but showable (the line must be shown).
BAD_EDITS: list[tuple[tuple[Any, ...], Any]] = [
    (("task",), "x"), (("task", "id"), [1]), (("task", "id"), None), (("task", "id"), 1.5),
    (("task", "id"), True), (("task", "env"), 3), (("task", "prompt"), 7),
    (("task", "prompt", 0, "role"), None), (("messages",), "hello"), (("messages", 1), 5),
    (("messages", 2, "content"), {"a": 1}), (("messages", 2, "tool_calls"), {}),
    (("messages", 2, "tool_calls", 0, "name"), []), (("trajectories",), {}),
    (("trajectories", 0), None), (("trajectories", 0, "token_ids"), ["a"]),
    (("trajectories", 0, "token_ids"), [-1]), (("trajectories", 0, "token_ids"), [2**40]),
    (("trajectories", 0, "token_ids"), [1.5]), (("trajectories", 0, "mask"), [True]),
    (("trajectories", 0, "logprobs"), ["x"]), (("reward",), "1"), (("reward",), []),
    (("rewards",), []), (("rewards", "correct"), "x"), (("errors",), "boom"), (("errors",), ["x"]),
    (("tool_errors",), []), (("tool_errors", "k"), "x"), (("num_turns",), "2"),
    (("num_turns",), 1.5), (("truncated",), "yes"), (("stop_reason",), 5),
    (("timings", "generate"), "x"), (("rollout_index",), None), (("task", "info"), nested(100)),
    (("state",), nested(100)),
]  # fmt: skip
OK_EDITS: list[tuple[tuple[Any, ...], Any]] = [
    (("reward",), NAN), (("reward",), INF), (("rewards", "correct"), -INF),
    (("trajectories", 0, "logprobs"), [NAN, 0.0]), (("reward",), 10**400), (("num_turns",), 10**400),
    (("messages", 2, "content"), "lone \ud800 surrogate"), (("task", "id"), "id-\udfff"),
    (("extra",), {"a": [1]}), (("task", "prompt"), "a plain prompt"), (("task", "id"), 12345),
    (("stop_reason",), None), (("task", "info"), nested(30)), (("task", "env"), PAYLOAD),
]  # fmt: skip
BAD_LINES = [
    b"[]", b'"text"', b"5", b"null", b"{not json", b'{"task": {"id": "t"', b"\xff\xfe{}",
    b"[" * 5000 + b"]" * 5000, b'{"task": {"id": "t"}, "reward": ' + b"9" * 5000 + b"}",
]  # fmt: skip
BAD_METRICS = [b"garbage", b"[1, 2]", b'{"step": 1, "x": \xff}', b"[" * 5000 + b"]" * 5000]
OK_METRICS = [
    {"step": 1, "loss": NAN},
    {"step": 2, "x": 10**400},
    {"step": "s", "y": "text"},
    {"\ud800": 1.0, "step": 4},
]


def edited(ep: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """A deep copy of `ep` with the field at `path` set to `value`."""
    out = json.loads(json.dumps(ep))
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def fuzz_rows(rng: random.Random, template: dict[str, Any], n: int) -> tuple[list[bytes], int]:
    """(n episode lines, how many must be skipped): valid, oddly shaped, or malformed."""
    lines, bad = [], 0
    for _ in range(n):
        kind = rng.choice(["good", "ok", "bad_edit", "bad_drop", "bad_line", "bad_bytes"])
        ep = template
        if kind == "ok":
            ep = edited(template, *rng.choice(OK_EDITS))
            if rng.random() < 0.3:
                ep = dict(reversed(ep.items()))  # unusual key order: the index parses it all
            if rng.random() < 0.3:
                ep.pop(rng.choice(["messages", "trajectories", "timings"]))
        elif kind == "bad_edit":
            ep = edited(template, *rng.choice(BAD_EDITS))
        elif kind == "bad_drop":
            path = rng.choice([("task",), ("task", "id"), ("messages", 0, "role")])
            ep = json.loads(json.dumps(template))
            node = ep
            for key in path[:-1]:
                node = node[key]
            del node[path[-1]]
        if kind == "bad_line":
            lines.append(rng.choice(BAD_LINES))
        elif kind == "bad_bytes":  # not UTF-8: a stray byte, or a surrogate encoded raw
            text = json.dumps(template).encode()
            at = text.index(b'"content": "') + 12
            lines.append(text[:at] + rng.choice([b"\xff", b"\xed\xa0\x80", b"\xc3"]) + text[at:])
        else:
            lines.append(json.dumps(ep).encode())
        bad += kind.startswith("bad")
        if rng.random() < 0.05:
            lines.append(b"   ")  # blank lines are neither episodes nor malformed
    return lines, bad


def get_any(url: str, path: str) -> tuple[int, Any]:
    """(status, strict JSON body) of any answer; fails on a 500 or on JSON with NaN."""
    try:
        with urllib.request.urlopen(url + path, timeout=30) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()

    def reject(name: str) -> None:
        raise AssertionError(f"{path}: {name} in JSON")

    assert status != 500, (path, raw[:500])
    return status, json.loads(raw.decode("utf-8"), parse_constant=reject)


def test_malformed_rows_never_break_the_api(viewer_server, tmp_path, tok_dir):
    rng = random.Random(1234)
    run = write_run(tmp_path / "fuzz", steps=2, tasks=2, group=1, eval_every=2, model=str(tok_dir))
    template = json.loads((run / "rollouts" / "step_000001.jsonl").read_text().splitlines()[0])
    expected_bad = {}
    for source, path in [
        ("train", run / "rollouts" / "step_000001.jsonl"),
        ("train", run / "rollouts" / "step_000002.jsonl"),
        ("eval", run / "eval" / "step_000002" / "results.jsonl"),
    ]:
        lines, bad = fuzz_rows(rng, template, 120)
        path.write_bytes(b"".join(line + b"\n" for line in lines))
        expected_bad[source] = expected_bad.get(source, 0) + bad
    with open(run / "metrics.jsonl", "ab") as f:
        f.write(b"".join(line + b"\n" for line in BAD_METRICS))
        f.write(b"".join(json.dumps(row).encode() + b"\n" for row in OK_METRICS))
    (run / "config.json").write_text(json.dumps({"model": str(tok_dir), "deep": nested(900)}))
    url = viewer_server(run)

    status, runs = get_any(url, "api/runs")
    assert status == 200
    status, metrics = get_any(url, "api/metrics?run=fuzz")
    assert status == 200 and len(metrics["rows"]) == 2 + len(OK_METRICS)
    assert metrics["notice"]["skipped"] == len(BAD_METRICS)
    assert get_any(url, "api/config?run=fuzz") == (200, {"config": None, "metadata": None})
    shown = []
    for source in ("train", "eval"):
        offset, res = 0, {"complete": False, "items": [None]}
        while not res["complete"] or res["items"]:
            status, res = get_any(
                url, f"api/rollouts?run=fuzz&source={source}&step=all&limit=37&offset={offset}"
            )
            assert status == 200
            shown += res["items"]
            offset += len(res["items"])
        assert res["skipped"] == expected_bad[source]
        filters = [
            "errors=errors",
            "errors=clean",
            "min=0.5",
            "max=0",
            "env=calc",
            "task=task-0001",
        ]
        for flt in filters:
            assert get_any(url, f"api/rollouts?run=fuzz&source={source}&step=all&{flt}")[0] == 200
    assert len(shown) == 3 * 120 - sum(expected_bad.values())
    for it in shown:
        status, ep = get_any(url, f"api/episode?run=fuzz&file={it['file']}&i={it['i']}&tokens=1")
        assert status == 200 and ep["episode"]["task"]["id"] is not None
    for key in ("train:1", "train:2", "eval:2"):
        for i in range(0, 130, 7):  # malformed and out-of-range rows answer 400, never 500
            status, body = get_any(url, f"api/episode?run=fuzz&file={key}&i={i}")
            assert status in (200, 400) and (status == 200 or body["error"])
    status, tasks = get_any(url, "api/tasks?run=fuzz&q=")
    assert status == 200 and "id-\udfff" in tasks["tasks"]
    status, runs = get_any(url, "api/runs")
    info = runs["runs"][0]
    assert info["skipped_total"] == sum(expected_bad.values()) + len(BAD_METRICS)
    assert sum(f["episodes_indexed"] for f in info["files"]) == len(shown)
