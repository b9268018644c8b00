"""One optimisation step on a batch of samples, as one loop a reader can follow top to bottom:

prepare (collate micro-batches; old and reference logprobs, values and GAE without gradient)
-> epochs (`updates_per_batch`) -> micro-batches (forward, loss, backward; gradients accumulate)
-> clip -> step. The loss is `policy_objective`; the batch normaliser makes the summed
micro-batch losses equal the loss of the whole batch. A step whose loss or gradient norm is not
finite is skipped (gradients dropped, weights and optimizer state untouched) and counted as
`nonfinite_skipped`; the scheduler still steps once per batch, so the learning rate stays a
function of the step number and a resumed run follows the same schedule. A batch with no
gradient at all (`_with_gradient` keeps no sample) runs no model; with `skip_uniform_steps` it
takes no optimizer step either (`_uniform_batch`), counted as `uniform_steps_skipped`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch

from looprl.algorithms.advantages import gae, terminal_rewards
from looprl.algorithms.aggregation import batch_normalizer
from looprl.algorithms.objective import LOSS_TERMS, policy_objective
from looprl.algorithms.presets import AlgorithmConfig
from looprl.algorithms.staleness import logprob_gap_by_lag, token_lags
from looprl.models.forward import TokenScores, forward_logprobs
from looprl.trainer import distributed as D
from looprl.trainer.batch import Batch, Sample, collate, micro_batches, prefix_micro_batches


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
    value_head: ValueHead | None = None
    ref_model: torch.nn.Module | None = None
    dist: D.Dist | None = None  # under torchrun: this rank trains on its share of the samples
    shared_prefix: bool = True  # forward micro-batches as prefix trees (trainer.shared_prefix)
    prefix_row_tokens: int = 1024  # nodes per prefix-tree row (trainer.prefix_row_tokens)
    skip_uniform_steps: bool = False  # no optimizer step on a batch with no gradient (trainer.*)


@dataclass
class _Prepared:
    """A micro-batch plus the no-grad quantities computed before the update."""

    batch: Batch
    padding: bool = False  # an FSDP filler: its loss is multiplied by 0 and its stats dropped
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    returns: torch.Tensor | None = None


def _chunks(ctx: UpdateContext, samples: list[Sample]) -> list[tuple[list[Sample], bool]]:
    """This rank's micro-batches, as (samples, is_padding).

    Under FSDP every rank must run as many forwards and backwards as the others (each one is a
    collective), so a rank with fewer micro-batches adds fillers: one trained token whose loss
    is multiplied by 0. Without `ctx.dist` this is every sample, and no filler. With
    `ctx.shared_prefix` micro-batches are whole prefix-tree rows, samples sharing a prompt together.
    """
    mine = D.block_share(samples, ctx.dist)  # a group's samples stay on one rank
    if ctx.shared_prefix:
        split = prefix_micro_batches(mine, ctx.micro_batch_tokens, ctx.prefix_row_tokens)
    else:
        split = micro_batches(mine, ctx.micro_batch_tokens)
    chunks = [(c, False) for c in split]
    filler = Sample([ctx.pad_id, ctx.pad_id], [0, 1], [0.0, 0.0], advantage=0.0, reward=0.0)
    missing = D.max_over_ranks(ctx.dist, len(chunks)) - len(chunks)
    return chunks + [([filler], True)] * missing


def _prepare(ctx: UpdateContext, samples: list[Sample]) -> list[_Prepared]:
    """Collate micro-batches and compute old logprobs, reference logprobs, values and GAE."""
    need_old = ctx.algo.updates_per_batch > 1 or ctx.algo.uses_value_head
    prepared = []
    for chunk, padding in _chunks(ctx, samples):
        rows = ctx.prefix_row_tokens if ctx.shared_prefix else 0
        batch = collate(chunk, ctx.pad_id, ctx.device, row_tokens=rows)
        p = _Prepared(batch=batch, padding=padding)
        with torch.no_grad():
            if need_old:
                old = _score(
                    ctx.model, p.batch, ctx.temperature, with_hidden=ctx.value_head is not None
                )
                p.old_logprobs = old.logprobs
                if ctx.value_head is not None and old.hidden is not None:
                    values = ctx.value_head(old.hidden)  # (B, T-1)
                    rewards = terminal_rewards(p.batch.rewards, p.batch.loss_mask)  # (B, T-1)
                    adv, ret = gae(rewards, values, p.batch.loss_mask, ctx.algo.gamma, ctx.algo.lam)
                    p.batch.advantages, p.old_values, p.returns = adv, values, ret
            if ctx.ref_model is not None:
                p.ref_logprobs = _score(ctx.ref_model, p.batch, ctx.temperature).logprobs
        prepared.append(p)
    return prepared


def _score(
    model: torch.nn.Module,
    batch: Batch,
    temperature: float,
    *,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    with_hidden: bool = False,
) -> TokenScores:
    """`forward_logprobs` on a collated micro-batch (its prefix tree if packed): (B, T-1) logprobs."""
    return forward_logprobs(
        model, batch.input_ids, batch.attention_mask, batch.targets, batch.loss_mask, temperature,
        with_entropy=with_entropy, entropy_grad=entropy_grad, with_hidden=with_hidden,
        packed=batch.packed,
    )  # fmt: skip


def _with_gradient(algo: AlgorithmConfig, samples: list[Sample]) -> list[Sample]:
    """The samples that can move the weights: those with a non-zero advantage.

    With no KL, entropy or value term every policy loss is a multiple of the sequence's advantage,
    so a zero-advantage sample (a uniform group under GRPO) contributes an exactly zero gradient
    and skipping its forward and backward changes nothing but the time. When all are zero the
    list is empty: `train_on_batch` then runs no model (`_uniform_batch`).
    """
    if algo.kl_coef > 0 or algo.entropy_coef > 0 or algo.uses_value_head:
        return samples
    return [s for s in samples if s.advantage != 0.0]


def _uniform_batch(ctx: UpdateContext, train_tokens: float) -> dict[str, float]:
    """Every sample's gradient is exactly zero (every advantage 0, no KL, entropy or value term).

    With `ctx.skip_uniform_steps` no optimizer step is taken: the weights and AdamW's state stay
    bit-identical. AdamW on zero gradients would still move them: by `lr * weight_decay * w`,
    and by its momentum `lr * m_hat / (sqrt(v_hat) + eps)` along the recent informative
    gradients, each such step beta1 / sqrt(beta2) (0.90 at 0.9, 0.99) as far as the one before,
    about ten informative steps' worth in all.
    Without it the optimizer takes its `updates_per_batch` steps on zero gradients, exactly as
    after a forward and backward that gave zeros. Either way no model runs, and the scheduler
    ticks once, so the learning rate stays a function of the step number (as for a non-finite
    step). Every rank decides alike (each sees the whole batch), so FSDP runs no collective here.
    """
    if not ctx.skip_uniform_steps:
        params = [p for group in ctx.optimizer.param_groups for p in group["params"]]
        for _epoch in range(ctx.algo.updates_per_batch):
            ctx.optimizer.zero_grad(set_to_none=True)
            for p in params:
                p.grad = torch.zeros_like(p)
            ctx.optimizer.step()
    with warnings.catch_warnings():  # a run whose first batch is skipped: the tick is on purpose
        warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step()`", UserWarning)
        ctx.scheduler.step()
    ctx.optimizer.zero_grad(set_to_none=True)
    return {
        "loss": 0.0, "grad_norm": 0.0, "nonfinite_skipped": 0.0, "forward_tokens": 0.0,
        "forward_positions": 0.0, "train_tokens": train_tokens,
        "uniform_steps_skipped": float(ctx.skip_uniform_steps),
        "lr": float(ctx.scheduler.get_last_lr()[0]),
    }  # fmt: skip


@dataclass
class StatsAccumulator:
    """Averages the micro-batch stats of one `train_on_batch` call over its optimizer steps.

    Loss terms (`LOSS_TERMS`) are contributions already divided by the whole batch's normaliser:
    they are summed over micro-batches and averaged over the `steps` optimizer steps, as is the
    gradient norm. Every other metric is a mean over a micro-batch's `num_tokens` trained tokens
    and is averaged weighted by those tokens.
    """

    steps: int
    sums: dict[str, float] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)

    def add_total(self, key: str, value: float) -> None:
        """A per-step total (a loss term, the gradient norm): averaged over the steps."""
        self.sums[key] = self.sums.get(key, 0.0) + value / self.steps
        self.weights[key] = 1.0

    def add_mean(self, key: str, value: float, tokens: float) -> None:
        """A mean over `tokens` trained tokens: averaged weighted by them."""
        self.sums[key] = self.sums.get(key, 0.0) + value * tokens
        self.weights[key] = self.weights.get(key, 0.0) + tokens

    def add_micro_batch(self, stats: dict[str, float]) -> None:
        """The stats of one micro-batch (`policy_objective`'s, plus token means of our own)."""
        tokens = stats.get("num_tokens", 0.0)
        for key, value in stats.items():
            if key in LOSS_TERMS:
                self.add_total(key, value)
            elif key != "num_tokens":
                self.add_mean(key, value, tokens)

    def means(self) -> dict[str, float]:
        """The averages; a metric seen only on micro-batches without trained tokens is left out."""
        return {k: total / self.weights[k] for k, total in self.sums.items() if self.weights[k] > 0}


def train_on_batch(
    ctx: UpdateContext, samples: list[Sample], trained_version: int | None = None
) -> dict[str, float]:
    """Run `updates_per_batch` optimizer steps over the samples; returns averaged statistics.

    With `trained_version` (the policy version of the weights being updated) the first forward
    also gives `async/logprob_gap_lag<b>`: mean |trainer - sampler logprob| over the trained
    tokens of each version lag (`_add_lag_gaps`; no extra forward).
    """
    if not samples:
        return {"skipped": 1.0}
    algo, value_head = ctx.algo, ctx.value_head
    # the normaliser counts every sample, as if the whole batch went through the loss
    masks = [torch.tensor(s.mask[1:], dtype=torch.float32)[None] for s in samples]  # (1, T-1)
    moving = _with_gradient(algo, samples)
    if not moving:
        return _uniform_batch(ctx, float(sum(float(m.sum()) for m in masks)))
    ctx.model.train()
    norm = batch_normalizer(algo.aggregation, masks, max_len=algo.max_len)
    prepared = _prepare(ctx, moving)
    params = [p for group in ctx.optimizer.param_groups for p in group["params"]]
    acc = StatsAccumulator(steps=ctx.algo.updates_per_batch)
    grad_norms: list[float] = []
    nonfinite = 0
    for epoch in range(ctx.algo.updates_per_batch):
        ctx.optimizer.zero_grad(set_to_none=True)
        loss_finite = True
        for p in prepared:
            new = _score(
                ctx.model, p.batch, ctx.temperature, with_entropy=True,
                entropy_grad=algo.entropy_coef > 0, with_hidden=value_head is not None,
            )  # fmt: skip
            values = None if value_head is None or new.hidden is None else value_head(new.hidden)
            old = p.old_logprobs if p.old_logprobs is not None else new.logprobs.detach()
            loss, stats = policy_objective(
                algo,
                logprobs=new.logprobs,  # (B, T-1), carries the gradient
                old_logprobs=old,  # (B, T-1)
                sampler_logprobs=p.batch.sampler_logprobs,  # (B, T-1)
                advantages=p.batch.advantages,  # (B, T-1)
                mask=p.batch.loss_mask,  # (B, T-1)
                ref_logprobs=p.ref_logprobs,
                entropy=new.entropy,
                values=values,
                old_values=p.old_values,
                returns=p.returns,
                normalizer=norm,
            )
            if p.padding:
                loss = loss * 0.0  # runs FSDP's collectives, adds nothing
            loss_finite = loss_finite and bool(torch.isfinite(loss.detach()))
            loss.backward()  # gradients accumulate over the micro-batches
            if not p.padding:
                acc.add_micro_batch({**stats, **_advantage_stats(p.batch)})
                if epoch == 0 and trained_version is not None:
                    _add_lag_gaps(acc, p.batch, new.logprobs, trained_version)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, ctx.grad_clip)  # global under FSDP
        # every rank skips together: the norm is global, a local loss is shared by max
        if D.max_over_ranks(ctx.dist, int(not loss_finite)) or not torch.isfinite(grad_norm):
            ctx.optimizer.zero_grad(set_to_none=True)
            nonfinite += 1
            continue
        grad_norms.append(float(grad_norm))
        ctx.optimizer.step()
    ctx.scheduler.step()
    real = [p for p in prepared if not p.padding]
    forward = {
        "forward_tokens": float(sum(int(p.batch.loss_mask.sum()) for p in real)),
        "forward_positions": float(sum(p.batch.positions for p in real)),
    }
    out = _over_ranks(ctx.dist, acc, forward)
    for norm_value in grad_norms:  # over the steps taken: a skipped step's norm is not finite
        out["grad_norm"] = out.get("grad_norm", 0.0) + norm_value / len(grad_norms)
    out["nonfinite_skipped"] = float(nonfinite)
    out["uniform_steps_skipped"] = 0.0
    out["train_tokens"] = float(sum(float(m.sum()) for m in masks))
    out["lr"] = float(ctx.scheduler.get_last_lr()[0])
    ctx.model.eval()
    return out


def _over_ranks(
    d: D.Dist | None, acc: StatsAccumulator, counts: dict[str, float]
) -> dict[str, float]:
    """The whole batch's stats: every rank's accumulator merged and its counts summed."""
    parts = D.gather_objects(d, (acc.sums, acc.weights, counts))
    merged = StatsAccumulator(steps=acc.steps)
    total: dict[str, float] = {}
    for sums, weights, part in parts:
        for key, value in sums.items():
            merged.sums[key] = merged.sums.get(key, 0.0) + value
            # a loss term is a share of the batch total (weight 1); other keys are token means
            merged.weights[key] = (
                1.0 if key in LOSS_TERMS else merged.weights.get(key, 0.0) + weights[key]
            )
        for key, value in part.items():
            total[key] = total.get(key, 0.0) + value
    return {**merged.means(), **total}


def _advantage_stats(batch: Batch) -> dict[str, float]:
    """Mean and mean absolute advantage over the micro-batch's trained tokens (none without any)."""
    adv = batch.advantages[batch.loss_mask > 0]  # (N,)
    if not adv.numel():
        return {}
    return {"adv_mean": float(adv.mean()), "adv_abs_mean": float(adv.abs().mean())}


def _add_lag_gaps(
    acc: StatsAccumulator, batch: Batch, logprobs: torch.Tensor, trained_version: int
) -> None:
    """Add the micro-batch's logprob gap per version lag (`looprl.algorithms.staleness`), from
    the logprobs of the update's first forward (the weights of `trained_version`)."""
    if batch.versions is None:
        return
    lags = token_lags(batch.versions, trained_version)  # (B, T-1)
    gaps = logprob_gap_by_lag(logprobs, batch.sampler_logprobs, lags, batch.loss_mask)
    for bucket, (gap, tokens) in gaps.items():
        acc.add_mean(f"async/logprob_gap_lag{bucket}", gap, tokens)
