"""benchmarks/gpu_check.py: its one line without CUDA, its FLOP counts and table, its GRPO samples,
its time box, and (slow) the whole script end to end on tiny CPU models, the only run possible
without a GPU."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from benchmarks.gpu_check import (
    FLOP_FACTOR,
    NO_CUDA,
    SHAPES,
    Budget,
    Row,
    format_table,
    grpo_samples,
    main,
    make_plan,
    parse_args,
    repeat,
)
from looprl.algorithms.presets import resolve_algorithm
from looprl.types import Generation

ROOT = Path(__file__).parents[1]


def _script(*args: str, cuda_visible: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if cuda_visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip


def test_without_cuda_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same on a GPU machine
    assert main([]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", NO_CUDA + "\n")


@pytest.mark.slow
def test_without_cuda_the_process_exits_2():
    done = _script(cuda_visible="")  # hides any GPU, so the test means the same everywhere
    assert (done.returncode, done.stdout, done.stderr) == (2, "", NO_CUDA + "\n")


def test_flops_per_token_by_phase():
    # N = 1e9 parameters: forward 2e9 FLOPs per token; median of (1000, 3000, 2000) = 2000 tokens/s
    train = Row("m", "train GRPO step", [1000.0, 3000.0, 2000.0], 2e9)
    decode = Row("m", "decode TorchEngine", [2000.0], 2e9)
    assert train.median == 2000.0
    assert train.tflops == pytest.approx(6e9 * 2000 / 1e12)  # 6·N per position: 12 TFLOP/s
    assert decode.tflops == pytest.approx(2e9 * 2000 / 1e12)  # 2·N per token: 4 TFLOP/s
    assert set(FLOP_FACTOR) == {"decode TorchEngine", "decode HF generate", "train GRPO step"}


def test_table_lines():
    rows = [
        Row("qwen3-0.6b", "train GRPO step", [50_000.0], 1e9),  # 3 x 1e9 x 5e4 = 150 TFLOP/s
        Row("qwen3-0.6b", "decode HF generate", [2_500.0], 1e9),  # 1e9 x 2500 = 2.5 TFLOP/s
    ]
    lines = format_table(rows, peak_tflops=600.0).splitlines()
    assert lines[0].split() == ["model", "phase", "tokens/s", "TFLOP/s", "MFU"]
    assert lines[1].split() == ["qwen3-0.6b", "train", "GRPO", "step", "50,000", "150", "25.0%"]
    assert lines[2].split() == ["qwen3-0.6b", "decode", "HF", "generate", "2,500", "2.5", "0.4%"]
    assert len({len(line) for line in lines}) == 1  # aligned columns


def test_shapes_are_the_published_ones():
    smol, qwen = SHAPES["smollm2-135m"], SHAPES["qwen3-0.6b"]
    assert (smol.hidden, smol.layers, smol.heads, smol.kv_heads, smol.intermediate, smol.vocab) == (
        576, 30, 9, 3, 1536, 49152,
    )  # fmt: skip
    assert (qwen.hidden, qwen.layers, qwen.heads, qwen.kv_heads, qwen.head_dim) == (
        1024, 28, 16, 8, 128,
    )  # fmt: skip
    assert (qwen.intermediate, qwen.vocab, qwen.tied) == (3072, 151936, True)


def test_grpo_samples_half_rewarded_every_sample_trained():
    prompts = [[5, 6, 7]] * 4
    answers = [Generation(text="", token_ids=[10 + i, 11], logprobs=[-1.0, -2.0]) for i in range(4)]
    samples = grpo_samples(prompts, answers, group=2, algo=resolve_algorithm("grpo"))
    assert [s.token_ids for s in samples][1] == [5, 6, 7, 11, 11]
    assert all(s.mask == [0, 0, 0, 1, 1] for s in samples)
    assert all(s.sampler_logprobs == [0.0, 0.0, 0.0, -1.0, -2.0] for s in samples)
    assert [s.reward for s in samples] == [0.0, 1.0, 0.0, 1.0]
    # GRPO: (r - mean) / (std + eps) within each group of two: -1/+1 scaled by the std (0.707)
    advantages = [s.advantage for s in samples]
    assert advantages[0] < 0 < advantages[1] and advantages[0] == pytest.approx(-advantages[1])
    assert advantages[:2] == advantages[2:]


def test_batch_must_be_whole_groups():
    with pytest.raises(SystemExit, match="positive multiple of --group 8"):
        make_plan(parse_args(["--batch", "12"]))
    assert make_plan(parse_args(["--tiny", "--batch", "12", "--group", "4"])).batch == 12


def test_budget_shares_and_repeat_stops():
    budget = Budget(10.0, cells=2)
    assert budget.next_cell() - time.monotonic() == pytest.approx(5.0, abs=0.5)  # half of 10 s
    assert not budget.spent()

    def fn() -> int:
        calls.append(1)
        return 100

    calls: list[int] = []
    assert len(repeat(fn, time.perf_counter, runs=5, until=0.0)) == 1  # past: one run still
    assert len(repeat(fn, time.perf_counter, runs=3, until=math.inf)) == 3
    assert len(calls) == 4
    assert Budget(0.0, cells=1).spent()


def _run_tiny(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "gpu_check.json"
    done = _script("--device", "cpu", "--tiny", "--out", str(out), *args)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    result = json.loads(out.read_text())
    table = [line for line in done.stdout.splitlines() if "(tiny)" in line and "%" in line]
    assert len(table) == len(result["rows"]), done.stdout
    return result


@pytest.mark.slow
def test_whole_script_on_tiny_cpu_models(tmp_path):
    result = _run_tiny(tmp_path)
    assert result["dtype"] == "float32" and result["peak_tflops"] > 0
    assert [(r["model"], r["phase"]) for r in result["rows"]] == [
        (f"{m} (tiny)", phase) for m in SHAPES for phase in FLOP_FACTOR
    ]
    for row in result["rows"]:
        assert (
            row["median_tokens_per_s"] > 0
            and 0 < row["mfu"] == row["tflops"] / result["peak_tflops"]
        )
    # both families decode on the engine's own KV path, not the one-sequence HF fallback
    assert {m["engine_backend"] for m in result["models"].values()} == {"LlamaKVModel"}


@pytest.mark.slow
def test_bf16_path_on_tiny_cpu_model(tmp_path):
    # the dtype the GPU run uses: a bf16 engine copy, bf16 autocast over float32 master weights
    result = _run_tiny(tmp_path, "--dtype", "bfloat16", "--models", "qwen3-0.6b")
    assert result["dtype"] == "bfloat16"
    assert [r["phase"] for r in result["rows"]] == list(FLOP_FACTOR)
