"""`looprl view` on a large run: 100k episodes in one file page fast and index in bounded memory."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from looprl.viewer import start_server
from looprl.viewer.synthetic import write_run

N = 100_000
TASKS = 1_000


@pytest.fixture(scope="module")
def big_run(tmp_path_factory) -> Path:
    """A run whose step 1 holds 100k episodes (~2 KB each), written from one template line."""
    root = tmp_path_factory.mktemp("big")
    run = write_run(root / "big", steps=1, tasks=1, group=1)
    path = run / "rollouts" / "step_000001.jsonl"
    ep = json.loads(path.read_text().splitlines()[0])
    ep["task"]["id"], ep["task"]["env"], ep["reward"] = "@ID@", "@ENV@", 123456.5
    ep["errors"] = "@ERR@"
    ep["trajectories"] = [{k: v[:40] for k, v in t.items()} for t in ep["trajectories"]]
    template = json.dumps(ep)
    rng = random.Random(0)
    with open(path, "w") as f:
        for n in range(N):
            line = template.replace("@ID@", f"t{n % TASKS:05d}").replace("@ENV@", f"env{n % 3}")
            line = line.replace("123456.5", f"{rng.random():.3f}")
            err = '[{"kind": "rollout", "message": "boom"}]' if n % 10 == 0 else "[]"
            f.write(line.replace('"@ERR@"', err) + "\n")
    return run


def get(url: str) -> dict:
    """GET a JSON API URL."""
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


@pytest.mark.slow
def test_first_page_is_fast_and_index_completes(big_run):
    size = (big_run / "rollouts" / "step_000001.jsonl").stat().st_size
    assert size > 150e6
    srv, url = start_server([big_run])
    try:
        t0 = time.perf_counter()
        first = get(url + "api/rollouts?run=big&step=all&limit=50")
        first_page_s = time.perf_counter() - t0
        assert first_page_s < 1.0
        assert len(first["items"]) == 50 and first["items"][0]["task_id"] == "t00000"
        t0 = time.perf_counter()
        res = first
        while not res["complete"]:
            res = get(url + "api/rollouts?run=big&step=all&limit=50&offset=99950")
        full_index_s = time.perf_counter() - t0
        assert res["total"] == N and res["items"][-1]["task_id"] == f"t{(N - 1) % TASKS:05d}"
        t0 = time.perf_counter()
        errs = get(url + "api/rollouts?run=big&errors=errors&env=env1&min=0.5&limit=20")
        assert time.perf_counter() - t0 < 1.0
        expected = sum(1 for n in range(0, N, 10) if n % 3 == 1)  # about half pass min=0.5
        assert 0.4 * expected < errs["total"] < 0.6 * expected
        task = get(url + "api/rollouts?run=big&task=t00007&limit=500")
        assert task["total"] == N // TASKS
        last = get(url + f"api/episode?run=big&file=train:1&i={N - 1}")
        assert last["episode"]["task"]["id"] == f"t{(N - 1) % TASKS:05d}"
        print(
            f"\n100k episodes, {size / 1e6:.0f} MB: first page {first_page_s:.3f} s, full index {full_index_s:.2f} s"
        )
    finally:
        srv.close()


INDEX_SCRIPT = """
import sys
from pathlib import Path
from looprl.viewer.runs import Catalog, Query

def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024

run = Catalog([Path(sys.argv[1])]).get("big")
before = rss("VmRSS:")
res = run.query(Query(step=None, limit=50), budget_s=120.0)
print(res["complete"], res["total"], before, rss("VmHWM:"))
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc to read RSS")
def test_index_memory_is_bounded(big_run):
    size = (big_run / "rollouts" / "step_000001.jsonl").stat().st_size
    out = subprocess.run(
        [sys.executable, "-c", INDEX_SCRIPT, str(big_run)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    complete, total, before, peak = out.stdout.split()
    assert complete == "True" and int(total) == N
    grown = int(peak) - int(before)
    assert grown < 50e6, f"indexing a {size / 1e6:.0f} MB file grew RSS by {grown / 1e6:.0f} MB"
    print(f"\nindex of {size / 1e6:.0f} MB file: peak RSS growth {grown / 1e6:.1f} MB")
