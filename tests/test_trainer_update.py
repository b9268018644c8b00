"""Tier 1-2: the update path's shortcuts change the time, never the result.

The fused output projection (logits only on trained positions, chunk by chunk) must give the
plain forward's logprobs, entropy and gradients; skipping zero-advantage samples must leave the
weights after an optimizer step where the full batch puts them.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from helpers import small_model

from looprl.algorithms.logprobs import (
    entropy_from_logits,
    head_logprobs_entropy,
    logprobs_from_logits,
)
from looprl.algorithms.presets import resolve_algorithm
from looprl.algorithms.staleness import logprob_gap_by_lag, token_lags
from looprl.models import forward as F
from looprl.trainer import batch as B
from looprl.trainer import update as U
from looprl.trainer.config import OptimSection
from looprl.trainer.setup import make_optimizer, make_scheduler
from looprl.types import EpisodeResult, Message, Task


def samples(n: int, seed: int = 0, zero_every: int = 3) -> list[B.Sample]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = rng.randint(6, 20)
        prompt = rng.randint(2, length - 2)
        ids = [rng.randrange(1, 50) for _ in range(length)]
        mask = [0] * prompt + [1] * (length - prompt)
        mask[prompt + 1] = 0  # an environment token inside the completion
        adv = 0.0 if i % zero_every == 0 else rng.uniform(-1.5, 1.5)
        lps = [0.0] * prompt + [-rng.uniform(0.5, 4.0) for _ in range(length - prompt)]
        out.append(B.Sample(ids, mask, lps, adv, adv))
    return out


def test_head_logprobs_entropy_matches_full_softmax():
    torch.manual_seed(0)
    hidden = torch.randn(13, 8, requires_grad=True)
    head = torch.nn.Linear(8, 11, bias=False)
    ids = torch.randint(0, 11, (13,))
    rows = head_logprobs_entropy(hidden, head, ids, temperature=0.7, chunk_size=4)
    logits = head(hidden)[None]  # (1, 13, 11)
    lp = logprobs_from_logits(logits, ids[None], temperature=0.7)[0]
    ent = entropy_from_logits(logits, temperature=0.7)[0]
    torch.testing.assert_close(rows[:, 0], lp)
    torch.testing.assert_close(rows[:, 1], ent)
    (g_fused,) = torch.autograd.grad((rows[:, 0] * 2 + rows[:, 1]).sum(), hidden)
    (g_plain,) = torch.autograd.grad((lp * 2 + ent).sum(), hidden)
    torch.testing.assert_close(g_fused, g_plain)
    assert head_logprobs_entropy(hidden[:0], head, ids[:0]).shape == (0, 2)


def test_fused_forward_equals_plain_forward(monkeypatch):
    model = small_model()
    batch = B.collate(samples(5), 0, "cpu")
    tensors = (batch.input_ids, batch.attention_mask, batch.targets, batch.loss_mask)
    lp, ent, hid = F.forward_logprobs(model, *tensors, 0.9, with_entropy=True, with_hidden=True)
    (lp * batch.advantages).sum().backward()
    fused_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    monkeypatch.setattr(F, "_FUSED_HEAD_TYPES", set())  # force the plain path
    lp2, ent2, hid2 = F.forward_logprobs(model, *tensors, 0.9, with_entropy=True, with_hidden=True)
    (lp2 * batch.advantages).sum().backward()
    torch.testing.assert_close(lp, lp2)
    torch.testing.assert_close(ent, ent2)
    torch.testing.assert_close(hid, hid2)
    for g, p in zip(fused_grads, model.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad)
    assert bool((lp[batch.loss_mask == 0] == 0).all())  # untrained positions are not scored
    assert bool((lp[batch.loss_mask > 0] < 0).all())


def _context(
    model: torch.nn.Module, preset: str, *, skip: bool = False, weight_decay: float = 0.01
) -> U.UpdateContext:
    optim = OptimSection(lr=1e-2, weight_decay=weight_decay)
    opt = make_optimizer(model, None, optim)
    return U.UpdateContext(
        model=model, optimizer=opt, scheduler=make_scheduler(opt, optim, 4),
        algo=resolve_algorithm(preset, use_tis=True), pad_id=0, device=torch.device("cpu"),
        temperature=1.0, micro_batch_tokens=64, grad_clip=1.0, skip_uniform_steps=skip,
    )  # fmt: skip


def _step(model: torch.nn.Module, preset: str, data: list[B.Sample]) -> dict[str, float]:
    ctx = _context(model, preset)
    stats = {}
    for _ in range(2):  # the second step sees Adam moments built on the first
        stats = U.train_on_batch(ctx, data)
    return stats


@pytest.mark.parametrize("preset", ["grpo", "dr_grpo", "gspo", "cispo", "rloo"])
def test_skipping_zero_advantage_samples_changes_nothing(monkeypatch, preset):
    data = samples(12)
    fast, full = small_model(), small_model()
    fast_stats = _step(fast, preset, data)
    monkeypatch.setattr(U, "_with_gradient", lambda algo, s: s)
    full_stats = _step(full, preset, data)
    for a, b in zip(fast.parameters(), full.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)  # lr 1e-2: a real change is ~1e-2
    assert fast_stats["train_tokens"] == full_stats["train_tokens"]
    assert fast_stats["forward_tokens"] < full_stats["forward_tokens"]


def test_all_zero_advantages_step_the_optimizer_without_skipping():
    data = [dataclasses.replace(s, advantage=0.0) for s in samples(4)]
    model = small_model()
    before = [p.detach().clone() for p in model.parameters()]
    stats = _step(model, "grpo", data)
    assert stats["grad_norm"] == 0.0
    # weight decay still applies, exactly as when every sample is forwarded
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


@pytest.mark.parametrize("preset", ["grpo", "gspo"])
def test_a_batch_with_no_gradient_steps_without_the_model(monkeypatch, preset):
    """All advantages zero: the weights end as when one zero-advantage sample is forwarded (the
    optimizer steps on exact zeros either way), and the model never runs."""
    data = [dataclasses.replace(s, advantage=0.0) for s in samples(4)]
    skipped, forwarded = small_model(), small_model()

    def no_forward(*args, **kwargs):
        raise AssertionError("the model ran for a batch with no gradient")

    monkeypatch.setattr(skipped, "forward", no_forward)
    stats = _step(skipped, preset, data)
    assert stats["forward_tokens"] == 0.0 and stats["grad_norm"] == 0.0
    assert stats["train_tokens"] == sum(sum(s.mask[1:]) for s in data)
    monkeypatch.setattr(U, "_with_gradient", lambda algo, s: s[:1])  # the path that forwarded one
    _step(forwarded, preset, data)
    for a, b in zip(skipped.parameters(), forwarded.parameters(), strict=True):
        assert torch.equal(a, b)


def test_kl_keeps_every_sample():
    algo = resolve_algorithm("grpo", kl_coef=0.1)
    data = samples(6)
    assert U._with_gradient(algo, data) == data


def test_the_logprob_gap_per_version_lag_comes_from_the_first_forward_and_changes_nothing():
    data = samples(9, zero_every=100)[1:]  # every sample moves the weights (the first would not)
    for i, s in enumerate(data):  # sample i was sampled by version 5 - i % 4: lags 0, 1, 2, 3
        s.versions = [5 - i % 4 if m else -1 for m in s.mask]
    model, plain = small_model(), small_model()
    batch = B.collate(data, 0, "cpu")
    with torch.no_grad():  # the weights the update starts from: version 5
        tensors = (batch.input_ids, batch.attention_mask, batch.targets, batch.loss_mask)
        before = F.forward_logprobs(model, *tensors, 1.0).logprobs  # (B, T-1)
    assert batch.versions is not None
    lags = token_lags(batch.versions, 5)
    expected = logprob_gap_by_lag(before, batch.sampler_logprobs, lags, batch.loss_mask)
    assert sorted(expected) == ["0", "1", "2", "3plus"]
    stats = U.train_on_batch(_context(model, "grpo"), data, trained_version=5)
    for bucket, (gap, _tokens) in expected.items():
        assert stats[f"async/logprob_gap_lag{bucket}"] == pytest.approx(gap, rel=1e-5)
    without = U.train_on_batch(
        _context(plain, "grpo"), data
    )  # no version: no gap metrics, same step
    assert without == {k: v for k, v in stats.items() if not k.startswith("async/")}
    for a, b in zip(model.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a, b)


def _uniform_after_informative(skip: bool) -> tuple[list[torch.Tensor], list[torch.Tensor], dict]:
    """(weights after one informative step, after a uniform batch next, the uniform batch's stats)
    under grpo with no weight decay: whatever moves the weights on the uniform batch is momentum."""
    model = small_model()
    ctx = _context(model, "grpo", skip=skip, weight_decay=0.0)
    U.train_on_batch(ctx, samples(6))
    after_signal = [p.detach().clone() for p in model.parameters()]
    state = {
        k: [t.clone() for t in v.values() if torch.is_tensor(t)]
        for k, v in ctx.optimizer.state.items()
    }
    stats = U.train_on_batch(ctx, [dataclasses.replace(s, advantage=0.0) for s in samples(4)])
    if skip:  # AdamW's moments and step count are untouched too, so a resume sees the same state
        for k, v in ctx.optimizer.state.items():
            now = [t for t in v.values() if torch.is_tensor(t)]
            assert all(torch.equal(a, b) for a, b in zip(state[k], now, strict=True))
    assert ctx.scheduler.last_epoch == 2  # the schedule ticks on every batch, skipped or not
    return after_signal, [p.detach().clone() for p in model.parameters()], stats


def test_a_uniform_batch_moves_the_weights_by_momentum_unless_skipped():
    before, after, stats = _uniform_after_informative(skip=True)
    assert stats["uniform_steps_skipped"] == 1.0 and stats["grad_norm"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    before, after, stats = _uniform_after_informative(skip=False)
    assert stats["uniform_steps_skipped"] == 0.0
    # zero gradient, no weight decay: AdamW's second step moves each weight by
    # lr * m2_hat / sqrt(v2_hat) = lr * (b1 / (1 + b1)) / sqrt(b2 / (1 + b2)) * sign(g1)
    # = 0.6716 lr with b1 0.9, b2 0.99, against lr for the first: ratio 0.6716 where |g1| >> eps
    first = torch.cat([(b - a).flatten() for a, b in zip(_initial(), before, strict=True)])
    second = torch.cat([(b - a).flatten() for a, b in zip(before, after, strict=True)])
    big = first.abs() > 0.999e-2  # weights whose first step was a full lr (|g1| >> eps)
    ratio = second[big] / first[big]  # float32 weights: the differences carry ~1e-5 of rounding
    expected = torch.full_like(ratio, 0.9 / 1.9 / (0.99 / 1.99) ** 0.5)
    torch.testing.assert_close(ratio, expected, rtol=1e-3, atol=0.0)


def _initial() -> list[torch.Tensor]:
    return [p.detach().clone() for p in small_model().parameters()]


def test_ppo_never_skips_a_batch_whose_advantages_are_all_zero():
    """PPO's advantages come from the value head (GAE), not the group: a batch is never uniform."""
    model = small_model()
    ctx = _context(model, "ppo", skip=True)
    ctx.value_head = U.ValueHead(model.config.hidden_size)
    data = [
        dataclasses.replace(s, advantage=0.0, reward=float(i % 2)) for i, s in enumerate(samples(4))
    ]
    stats = U.train_on_batch(ctx, data)
    assert stats["uniform_steps_skipped"] == 0.0 and stats["forward_tokens"] > 0


def test_alike_groups_are_split_by_whether_they_solved_the_task():
    def group(*rewards: float) -> list[EpisodeResult]:
        task = Task(id="t", prompt=[Message(role="user", content="q")])
        return [EpisodeResult(task=task, reward=r) for r in rewards]

    # 4 groups: all solved, all failed at 0, all alike at a partial 0.5 (none solved), mixed
    groups = [
        group(1.0, 1.0, 1.0),
        group(0.0, 0.0, 0.0),
        group(0.5, 0.5, 0.5),
        group(1.0, 0.0, 1.0),
    ]
    _, stats = B.samples_from_groups(groups, resolve_algorithm("grpo"), max_len=16)
    assert (stats["all_correct_frac"], stats["all_wrong_frac"]) == (0.25, 0.5)
    assert stats["all_correct_frac"] + stats["all_wrong_frac"] == stats["zero_var_frac"]
