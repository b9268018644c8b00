"""The engine seam: one factory for eval and training, and the interface the trainer drives."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from looprl.engines.base import Engine, TrainableEngine
from looprl.engines.factory import make_engine, make_trainable_engine
from looprl.engines.openai_engine import OpenAIEngine
from looprl.trainer.config import load_config
from looprl.trainer.trainer import Trainer

LENGTH_ENV = str(Path(__file__).parent / "envs" / "length_env.py")


def test_factory_builds_both_kinds_and_only_torch_is_trainable(tiny) -> None:
    model, tokenizer = tiny
    torch_engine = make_engine("torch", model=model, tokenizer=tokenizer)
    try:
        assert isinstance(torch_engine, TrainableEngine) and torch_engine.policy_version == 0
    finally:
        asyncio.run(torch_engine.close())
    server = make_engine("openai", model_name="m", base_url="http://127.0.0.1:9/v1")
    assert isinstance(server, OpenAIEngine) and isinstance(server, Engine)
    assert not isinstance(server, TrainableEngine)
    with pytest.raises(ValueError, match="cannot be trained"):
        make_trainable_engine("openai", model_name="m", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(ValueError, match="needs the model and tokenizer"):
        make_engine("torch")
    with pytest.raises(ValueError, match="unknown engine kind 'sglang'"):
        make_engine("sglang")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs model_dir .* or base_urls"):
        make_engine("vllm", tokenizer=tokenizer)


def test_sync_without_weights_moves_only_the_version(tiny) -> None:
    model, tokenizer = tiny
    engine = make_trainable_engine("torch", model=model, tokenizer=tokenizer)
    try:
        engine.sync_weights(None, version=5)
        assert engine.policy_version == 5
        engine.sync_weights(None)
        assert engine.policy_version == 6
    finally:
        asyncio.run(engine.close())


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True])
def test_trainer_engine_samples_the_latest_policy_version(tmp_path, lora) -> None:
    """Shared tensors (full fine-tuning) or a synced copy (LoRA): the version follows the step."""
    cfg = load_config(
        None,
        {"model.name": "tiny", "model.lora": lora, "env.name": LENGTH_ENV,
         "rollout.tasks_per_step": 2, "rollout.rollouts_per_task": 2, "trainer.steps": 2,
         "trainer.eval_every": 0, "trainer.eval_tasks": 2, "trainer.save_every": 2,
         "run.output_dir": str(tmp_path), "run.name": f"seam-{lora}", "run.tensorboard": False,
         "engine.max_concurrency": 3},
    )  # fmt: skip
    trainer = Trainer(cfg)
    trainer.run()
    assert isinstance(trainer.engine, TrainableEngine)
    assert trainer.engine.policy_version == 2
    assert trainer.engine.max_batch_size == 3  # type: ignore[attr-defined]  # the KV slots
