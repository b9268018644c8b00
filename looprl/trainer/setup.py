"""Building what a training run needs: environment, device, model (+LoRA), optimizer, schedule.

Where the model generates and how its weights reach the engine is `looprl.engines.placement`.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import torch

from looprl.trainer.config import ConfigError, OptimSection, TrainConfig


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def load_env(cfg: TrainConfig) -> Any:
    """The configured environment, or a ConfigError naming `env.name` and the fix."""
    from looprl.envs.registry import load_environment

    try:
        return load_environment(cfg.env.name, **cfg.env.kwargs)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"env.name: {exc}") from None


def check_servers(cfg: TrainConfig) -> None:
    """A ConfigError naming the value and the fix for an `engine.base_urls` entry that is not an
    http(s) URL or where no server answers (checked before the run directory is made)."""
    from looprl.engines.vllm_server import url_problem

    for url in cfg.engine.base_urls:
        problem = url_problem(url)
        if problem:
            raise ConfigError(f"--engine.base_urls {url!r}: {problem}")


def pick_device(name: str | None) -> torch.device:
    """cuda when available (or asked for), else cpu."""
    if name:
        return torch.device(name)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def wrap_lora(model: torch.nn.Module, cfg: TrainConfig) -> torch.nn.Module:
    """Wrap the model with a PEFT LoRA adapter on the configured modules."""
    from peft import LoraConfig, get_peft_model

    present = {name.split(".")[-1] for name, _ in model.named_modules()}
    targets = [t for t in cfg.model.lora_targets if t in present]
    if not targets:
        raise ConfigError(
            f"model.lora_targets: none of {cfg.model.lora_targets} exist in the model"
        )
    lora = LoraConfig(
        r=cfg.model.lora_r,
        lora_alpha=cfg.model.lora_alpha,
        lora_dropout=cfg.model.lora_dropout,
        target_modules=targets,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora)


def make_optimizer(
    model: torch.nn.Module, value_head: torch.nn.Module | None, optim: OptimSection
) -> torch.optim.AdamW:
    """AdamW over trainable policy weights (and the value head at its own learning rate)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups: list[dict[str, Any]] = [{"params": params, "lr": optim.lr}]
    if value_head is not None:
        groups.append(
            {"params": list(value_head.parameters()), "lr": optim.value_lr or optim.lr * 10}
        )
    return torch.optim.AdamW(
        groups, betas=(optim.beta1, optim.beta2), weight_decay=optim.weight_decay, eps=1e-8
    )


def make_scheduler(
    optimizer: torch.optim.Optimizer, optim: OptimSection, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up then constant, linear or cosine decay to zero over `total_steps`."""

    def factor(step: int) -> float:
        if optim.warmup_steps and step < optim.warmup_steps:
            return (step + 1) / optim.warmup_steps
        if optim.schedule == "constant":
            return 1.0
        progress = (step - optim.warmup_steps) / max(1, total_steps - optim.warmup_steps)
        progress = min(max(progress, 0.0), 1.0)
        if optim.schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
