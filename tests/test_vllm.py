"""Training against a real vLLM server (the CPU build, in its own venv) on the tiny model.

The trainer's weights reach the server after every step (the logprob gap stays at float32
noise), a skipped sync shows up as a large gap, a SIGKILLed trainer leaves no vLLM process and
nothing in RAM behind, and a server that dies is restarted with the current weights. Skipped
when the vLLM venv is absent (`make test` builds it: `make vllm`).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from looprl.engines.base import GenerationRequest
from looprl.engines.ram_dirs import ram_root
from looprl.types import SamplingParams

pytestmark = [pytest.mark.slow, pytest.mark.vllm]  # skipped without the venv: conftest.py
LENGTH_ENV = str(Path(__file__).parent / "envs" / "length_env.py")
GAP_SYNCED = 1e-4  # measured: 2.1e-7 to 2.5e-7 per step on the tiny model (float32 noise)
GAP_STALE = 1e-2  # measured: 0.30 and 0.33 on steps 2-3 without a sync at lr 1e-3
GAP_LORA = 1e-4  # LoRA applied by vLLM's kernels, not merged: 1.9e-7 to 2.5e-7 measured


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One vLLM server on the tiny model for the module's runs (they send their own weights)."""
    from looprl.engines.vllm_server import VLLMServer
    from looprl.models.loading import load_model
    from looprl.trainer.checkpoint.single import export_hf

    model_dir = tmp_path_factory.mktemp("tiny-hf")
    export_hf(*load_model("tiny"), model_dir)
    with VLLMServer(model_dir, max_model_len=2048) as srv:
        yield srv


def _run(tmp_path: Path, name: str, base_url: str, **overrides) -> list[dict]:
    from looprl.trainer.config import load_config
    from looprl.trainer.trainer import Trainer

    cfg = {
        "model.name": "tiny", "env.name": LENGTH_ENV, "rollout.tasks_per_step": 4,
        "rollout.rollouts_per_task": 4, "trainer.steps": 3, "trainer.eval_every": 0,
        "trainer.eval_tasks": 2, "trainer.save_every": 3, "optim.lr": 1e-3,
        "run.output_dir": str(tmp_path), "run.name": name, "run.tensorboard": False,
        "engine.kind": "vllm", "engine.base_urls": [base_url], **overrides,
    }  # fmt: skip
    trainer = Trainer(load_config(None, cfg))
    trainer.run()
    return [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


def test_three_grpo_steps_keep_the_logprob_gap_at_float32_noise(server, tmp_path) -> None:
    rows = _run(tmp_path, "synced", server.base_url)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["policy/logprob_gap"] < GAP_SYNCED for r in rows), [
        r["policy/logprob_gap"] for r in rows
    ]
    assert all(r["policy/mismatch_kl"] < GAP_SYNCED for r in rows)
    assert rows[-1]["reward/mean"] > 0


def test_a_skipped_sync_shows_a_large_gap(server, tmp_path, monkeypatch) -> None:
    from looprl.engines.vllm_engine import VLLMEngine

    def stale(self, weights, *, version=None):  # the version moves, the weights do not
        self.policy_version = version

    rows_first = _run(tmp_path, "first", server.base_url)  # the start sync sets the weights
    assert rows_first[0]["policy/logprob_gap"] < GAP_SYNCED
    monkeypatch.setattr(VLLMEngine, "sync_weights", stale)
    rows = _run(tmp_path, "stale", server.base_url, **{"trainer.seed": 1})
    assert all(r["policy/logprob_gap"] > GAP_STALE for r in rows[1:]), [
        r["policy/logprob_gap"] for r in rows
    ]


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (process group, command line) of every process."""
    out = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                stat = (proc / "stat").read_text()
                cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            pgrp = int(stat.rsplit(")", 1)[1].split()[2])
            out[int(proc.name)] = (pgrp, cmdline)
    return out


def _server_groups(marker: str) -> set[int]:
    """Process groups of the vLLM servers started on a model directory holding `marker`."""
    return {g for g, cmd in _processes().values() if marker in cmd and "vllm_shim" in cmd}


def test_a_sigkilled_trainer_leaves_no_vllm_process(tmp_path) -> None:
    cmd = [sys.executable, "-m", "looprl.cli.main", "train", "--model.name", "tiny"]
    cmd += ["--env.name", LENGTH_ENV, "--engine.kind", "vllm", "--trainer.steps", "50"]
    cmd += ["--rollout.tasks_per_step", "2", "--rollout.rollouts_per_task", "2"]
    cmd += ["--run.output_dir", str(tmp_path), "--run.name", "killed", "--run.tensorboard", "false"]
    log = (tmp_path / "train.log").open("wb")
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    metrics = tmp_path / "killed" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and metrics.read_text().strip()) and time.monotonic() < deadline:
        assert proc.poll() is None, (tmp_path / "train.log").read_text()[-3000:]
        time.sleep(0.5)
    groups = _server_groups("-vllm-model-")
    members = [pid for pid, (g, _) in _processes().items() if g in groups]
    assert len(members) >= 2, "the run's vLLM server (shim, API server, engine) was not found"
    owned = list(ram_root().glob(f"looprl-{proc.pid}-*"))
    assert len(owned) == 2, owned  # the model export and the weights folder, named after it
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()

    def left() -> list[int]:
        return [pid for pid, (g, _) in _processes().items() if g in groups]

    deadline = time.monotonic() + 30
    while left() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left(), [_processes().get(p) for p in left()]
    assert not [p for p in owned if p.exists()]  # its shim removed them from RAM


def test_async_one_step_ahead_against_vllm(server, tmp_path) -> None:
    rows = _run(tmp_path, "async", server.base_url, **{"trainer.max_async_steps": 1})
    assert [r["rollout/staleness"] for r in rows] == [0, 1, 1]
    assert rows[0]["policy/logprob_gap"] < GAP_SYNCED  # sampled by the weights it trains
    assert all(r["policy/tis_weight_mean"] > 0 for r in rows)  # TIS is on with vLLM


def test_eval_with_the_vllm_engine(tmp_path) -> None:
    from looprl.cli.main import main

    out = tmp_path / "ev"
    args = ["eval", "calculator", "--model", "tiny", "--engine.kind", "vllm", "-n", "2", "-r", "2"]
    assert main([*args, "--max-tokens", "16", "--output", str(out)]) == 0
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["engine"] == "vllm" and meta["summary"]["episodes"] == 4
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert all(sum(r["trajectories"][0]["mask"]) > 0 for r in rows)  # sampled ids came back
    assert not _server_groups("-vllm-model-")  # the engine closed its server


def test_a_model_vllm_cannot_load_names_the_cause(tmp_path) -> None:
    from looprl.engines.vllm_server import VLLMServer, VLLMServerError

    (tmp_path / "config.json").write_text('{"model_type": "no_such_architecture"}')
    with pytest.raises(VLLMServerError, match=r"(?s)exited with code .* end of its log"):
        VLLMServer(tmp_path, startup_timeout=120).start()


def test_a_bad_engine_option_is_one_line(capsys) -> None:
    from looprl.cli.main import main

    assert main(["eval", "calculator", "--engine.kind", "sglang"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --engine.kind sglang: Input should be 'torch' or 'vllm'")


def test_lora_adapters_are_hot_loaded_each_step(tmp_path) -> None:
    """LoRA with servers looprl starts (--enable-lora): a new adapter version per step."""
    from looprl.trainer.config import load_config
    from looprl.trainer.trainer import Trainer

    cfg = {
        "model.name": "tiny", "model.lora": True, "model.lora_r": 8, "env.name": LENGTH_ENV,
        "rollout.tasks_per_step": 4, "rollout.rollouts_per_task": 4, "trainer.steps": 3,
        "trainer.eval_every": 0, "trainer.eval_tasks": 2, "trainer.save_every": 3,
        "optim.lr": 1e-2, "run.output_dir": str(tmp_path), "run.name": "lora",
        "run.tensorboard": False, "engine.kind": "vllm",
    }  # fmt: skip
    trainer = Trainer(load_config(None, cfg))
    trainer.run()
    rows = [json.loads(x) for x in (tmp_path / "lora" / "metrics.jsonl").read_text().splitlines()]
    assert trainer.engine.clients[0].model == "policy-v3"  # type: ignore[attr-defined]
    assert all(r["policy/logprob_gap"] < GAP_LORA for r in rows), [
        r["policy/logprob_gap"] for r in rows
    ]


def test_two_servers_share_groups_fail_over_then_restart(tmp_path) -> None:
    """Groups spread over both servers by task id; a dead server's requests go to the other; with
    both dead a request is an infra error naming the connection; the next weight sync restarts
    both with the current weights."""
    from looprl.engines.vllm_engine import VLLMEngine
    from looprl.models.loading import load_model
    from looprl.trainer.checkpoint.single import export_hf

    model, tokenizer = load_model("tiny")
    export_hf(model, tokenizer, tmp_path / "m")
    engine = VLLMEngine(tmp_path / "m", tokenizer, num_servers=2, max_model_len=512)

    def request(task: str) -> GenerationRequest:
        return GenerationRequest(
            prompt_ids=[1, 2, 3], sampling=SamplingParams(max_tokens=4, seed=1), affinity=task
        )

    def kill(i: int) -> None:
        os.killpg(engine.servers[i].process.pid, signal.SIGKILL)  # type: ignore[union-attr]
        engine.servers[i].process.wait()  # type: ignore[union-attr]

    try:
        tasks = [f"task-{i}" for i in range(8)]
        homes = {t: engine._pick(request(t)) for t in tasks}
        assert set(homes.values()) == {0, 1}  # both servers get groups
        for t in tasks:
            assert asyncio.run(engine.generate(request(t))).finish_reason != "error"
        assert all(c.stats["requests"] > 0 for c in engine.clients)
        kill(0)
        orphan = next(t for t in tasks if homes[t] == 0)
        assert asyncio.run(engine.generate(request(orphan))).finish_reason != "error"
        assert engine.stats["failovers"] == 1
        kill(1)
        dead = asyncio.run(engine.generate(request(orphan)))
        assert dead.finish_reason == "error" and "connection" in (dead.error or "")
        engine.sync_weights(model.state_dict(), version=1)  # restarts both, then reloads
        assert engine.stats["restarts"] == 2 and all(s.alive() for s in engine.servers)
        assert asyncio.run(engine.generate(request(orphan))).finish_reason != "error"
    finally:
        asyncio.run(engine.close())
    assert not any(s.alive() for s in engine.servers)
