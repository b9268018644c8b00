"""One optimisation step on a batch of samples: micro-batches, gradient accumulation, PPO extras."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from looprl.algorithms.advantages import gae, terminal_rewards
from looprl.algorithms.aggregation import batch_normalizer
from looprl.algorithms.objective import policy_objective
from looprl.algorithms.presets import AlgorithmConfig
from looprl.trainer.batch import Batch, Sample, collate, forward_logprobs, micro_batches


class ValueHead(torch.nn.Module):
    """PPO's critic: a linear head on the policy trunk's last hidden state (one value per token).

    We share the trunk instead of training a separate critic model: half the memory and compute
    on a CPU, and the policy's features are what the value needs to read. The value gradient is
    stopped at the trunk (the head reads detached hidden states) so the critic cannot disturb
    the policy; this is the usual choice for small-model PPO with a shared backbone.
    """

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.proj.weight)
        torch.nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, T, H) -> (B, T) values."""
        return self.proj(hidden.detach().float()).squeeze(-1)


@dataclass
class UpdateContext:
    """What an update needs besides the batch."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    algo: AlgorithmConfig
    pad_id: int
    device: torch.device
    temperature: float
    micro_batch_tokens: int
    grad_clip: float
    updates_per_batch: int = 1
    value_head: ValueHead | None = None
    ref_model: torch.nn.Module | None = None


@dataclass
class _Prepared:
    """A micro-batch plus the no-grad quantities computed before the update."""

    batch: Batch
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    returns: torch.Tensor | None = None


def _prepare(ctx: UpdateContext, samples: list[Sample]) -> list[_Prepared]:
    """Collate micro-batches and compute old logprobs, reference logprobs, values and GAE."""
    need_old = ctx.updates_per_batch > 1 or ctx.algo.uses_value_head
    prepared = []
    by_length = sorted(samples, key=lambda s: len(s.token_ids))  # similar lengths pad less
    for chunk in micro_batches(by_length, ctx.micro_batch_tokens):
        p = _Prepared(batch=collate(chunk, ctx.pad_id, ctx.device))
        with torch.no_grad():
            if need_old:
                lp, _, hidden = forward_logprobs(
                    ctx.model, p.batch, ctx.temperature, with_hidden=ctx.value_head is not None
                )
                p.old_logprobs = lp
                if ctx.value_head is not None and hidden is not None:
                    values = ctx.value_head(hidden)  # (B, T-1)
                    rewards = terminal_rewards(p.batch.rewards, p.batch.loss_mask)  # (B, T-1)
                    adv, ret = gae(rewards, values, p.batch.loss_mask, ctx.algo.gamma, ctx.algo.lam)
                    p.batch.advantages, p.old_values, p.returns = adv, values, ret
            if ctx.ref_model is not None:
                p.ref_logprobs, _, _ = forward_logprobs(ctx.ref_model, p.batch, ctx.temperature)
        prepared.append(p)
    return prepared


def _with_gradient(algo: AlgorithmConfig, samples: list[Sample]) -> list[Sample]:
    """The samples that can move the weights: those with a non-zero advantage.

    With no KL, entropy or value term every policy loss is a multiple of the sequence's advantage,
    so a zero-advantage sample (a uniform group under GRPO) contributes an exactly zero gradient
    and skipping its forward and backward changes nothing but the time. One sample is kept when
    all are zero, so the optimizer still steps on zero gradients exactly as before.
    """
    if algo.kl_coef > 0 or algo.entropy_coef > 0 or algo.uses_value_head:
        return samples
    moving = [s for s in samples if s.advantage != 0.0]
    return moving or samples[:1]


def train_on_batch(ctx: UpdateContext, samples: list[Sample]) -> dict[str, float]:
    """Run `updates_per_batch` optimizer steps over the samples; returns averaged statistics."""
    if not samples:
        return {"skipped": 1.0}
    ctx.model.train()
    # the normaliser counts every sample, as if the whole batch went through the loss
    masks = [torch.tensor(s.mask[1:], dtype=torch.float32)[None] for s in samples]  # (1, T-1)
    norm = batch_normalizer(ctx.algo.aggregation, masks, max_len=ctx.algo.max_len)
    prepared = _prepare(ctx, _with_gradient(ctx.algo, samples))
    totals: dict[str, float] = defaultdict(float)
    weights: dict[str, float] = defaultdict(float)
    for _ in range(ctx.updates_per_batch):
        ctx.optimizer.zero_grad(set_to_none=True)
        for p in prepared:
            stats = _micro_step(ctx, p, norm)
            n = stats.get("num_tokens", 0.0)
            for key, value in stats.items():
                if key in ("loss", "pg_loss", "kl_loss", "entropy_loss", "value_loss"):
                    totals[key] += value / ctx.updates_per_batch  # contributions already normalised
                    weights[key] = 1.0
                elif key != "num_tokens":
                    totals[key] += value * n
                    weights[key] += n
        params = [p for group in ctx.optimizer.param_groups for p in group["params"]]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, ctx.grad_clip)
        totals["grad_norm"] += float(grad_norm) / ctx.updates_per_batch
        weights["grad_norm"] = 1.0
        ctx.optimizer.step()
    ctx.scheduler.step()
    out = {k: totals[k] / weights[k] for k in totals if weights[k] > 0}
    out["train_tokens"] = float(sum(float(m.sum()) for m in masks))
    out["forward_tokens"] = float(sum(int(p.batch.loss_mask.sum()) for p in prepared))
    out["forward_positions"] = float(sum(int(p.batch.attention_mask.sum()) for p in prepared))
    out["lr"] = float(ctx.scheduler.get_last_lr()[0])
    ctx.model.eval()
    return out


def _micro_step(ctx: UpdateContext, p: _Prepared, norm: float) -> dict[str, float]:
    """Forward, loss and backward for one micro-batch (gradients accumulate)."""
    logprobs, entropy, hidden = forward_logprobs(
        ctx.model,
        p.batch,
        ctx.temperature,
        with_entropy=True,
        entropy_grad=ctx.algo.entropy_coef > 0,
        with_hidden=ctx.value_head is not None,
    )
    values = ctx.value_head(hidden) if ctx.value_head is not None and hidden is not None else None
    old = p.old_logprobs if p.old_logprobs is not None else logprobs.detach()
    loss, stats = policy_objective(
        ctx.algo,
        logprobs=logprobs,
        old_logprobs=old,
        sampler_logprobs=p.batch.sampler_logprobs,
        advantages=p.batch.advantages,
        mask=p.batch.loss_mask,
        ref_logprobs=p.ref_logprobs,
        entropy=entropy,
        values=values,
        old_values=p.old_values,
        returns=p.returns,
        normalizer=norm,
    )
    loss.backward()
    adv = p.batch.advantages[p.batch.loss_mask > 0]
    if adv.numel():
        stats["adv_mean"] = float(adv.mean())
        stats["adv_abs_mean"] = float(adv.abs().mean())
    return stats
