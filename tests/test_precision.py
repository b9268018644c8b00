"""bf16 training compute over float32 master weights (`model.dtype = "bfloat16"`), one process.

The 2-process (FSDP mixed-precision) run is in tests/test_distributed.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from looprl.models.forward import forward_logprobs
from looprl.models.loading import load_model
from looprl.trainer.config import ConfigError, load_config
from looprl.trainer.precision import AutocastModel, compute_dtype
from looprl.trainer.trainer import Trainer

LENGTH_ENV = str(Path(__file__).parent / "envs" / "length_env.py")
# measured on the tiny model (see the prints): bf16 against float32 logprobs differ by at most
# 0.0036 nats on these tokens; after one step the gradient norm by 0.06%, the entropy by 4e-7
LOGPROB_ABS = 0.03
METRIC_REL = 0.01


def test_bfloat16_warns_on_cpu_and_float32_changes_nothing() -> None:
    said: list[str] = []
    assert compute_dtype("float32", torch.device("cpu"), said.append) is None and not said
    assert compute_dtype("bfloat16", torch.device("cpu"), said.append) is torch.bfloat16
    assert len(said) == 1 and "\n" not in said[0] and "model.dtype = 'float32'" in said[0]
    with pytest.raises(ConfigError, match="model.dtype"):
        load_config(None, {"model.dtype": "float16"})


def test_autocast_scoring_is_bf16_close_and_returns_float32() -> None:
    model, _tok = load_model("tiny", device="cpu")
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, model.config.vocab_size, (2, 12), generator=gen)  # (B, T)
    attn = torch.ones_like(ids)
    mask = torch.ones(2, 11)
    mask[0, :4] = 0  # a prompt that is not scored
    plain = forward_logprobs(model, ids, attn, ids[:, 1:], mask, with_entropy=True)
    wrapped = AutocastModel(model, torch.bfloat16)
    bf16 = forward_logprobs(
        wrapped, ids, attn, ids[:, 1:], mask, with_entropy=True, with_hidden=True
    )
    assert bf16.logprobs.dtype == torch.float32 and bf16.hidden is not None
    assert bf16.hidden.dtype == torch.float32  # the value head reads float32
    assert next(model.parameters()).dtype == torch.float32  # master weights untouched
    gap = float((bf16.logprobs - plain.logprobs).detach().abs().max())
    print(f"bf16 vs float32 logprobs: max |diff| {gap:.3g}")
    assert 0 < gap <= LOGPROB_ABS  # bf16 really computed (not equal), and close


def _one_step(tmp_path: Path, dtype: str) -> dict:
    cfg = load_config(
        None,
        {
            "model.name": "tiny", "model.dtype": dtype, "env.name": LENGTH_ENV,
            "rollout.tasks_per_step": 2, "rollout.rollouts_per_task": 2, "trainer.steps": 1,
            "trainer.eval_every": 0, "trainer.eval_tasks": 1, "trainer.save_rollouts": 0,
            "optim.lr": 1e-3, "run.output_dir": str(tmp_path), "run.name": dtype,
            "run.tensorboard": False,
        },
    )  # fmt: skip
    Trainer(cfg).run()
    return json.loads((tmp_path / dtype / "metrics.jsonl").read_text().splitlines()[0])


@pytest.mark.slow
def test_one_bfloat16_step_matches_float32(tmp_path: Path) -> None:
    fp32, bf16 = _one_step(tmp_path, "float32"), _one_step(tmp_path, "bfloat16")
    assert bf16["train/tokens"] == fp32["train/tokens"] > 0  # the same episodes
    for key in ("loss/total", "train/grad_norm", "policy/entropy"):
        print(f"{key}: float32 {fp32[key]:.6g}, bfloat16 {bf16[key]:.6g}")
        assert bf16[key] == pytest.approx(fp32[key], rel=METRIC_REL), key
    assert fp32["train/grad_norm"] > 0
