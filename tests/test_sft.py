"""Tier 1: the SFT loss: trained tokens only, micro-batching is exact, bad settings are refused."""

from __future__ import annotations

import math
import random

import pytest
import torch
from helpers import small_model

from looprl.sft.train import SFTExample, masked_logprobs, sft_backward, sft_optim, sft_train
from looprl.trainer.batch import micro_batches
from looprl.trainer.setup import make_optimizer, make_scheduler


def examples(n: int, seed: int = 0) -> list[SFTExample]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(5, 30)
        start = rng.randint(1, length - 2)
        ids = [rng.randrange(1, 50) for _ in range(length)]
        out.append(SFTExample(ids, [0] * start + [1] * (length - start)))
    return out


def reference_loss(model: torch.nn.Module, batch: list[SFTExample]) -> torch.Tensor:
    """Mean NLL over trained tokens from the model's full logits, one sequence at a time."""
    nll, count = torch.zeros(()), 0
    for ex in batch:
        ids = torch.tensor([ex.token_ids])
        logits = model(input_ids=ids).logits[0, :-1].float()
        keep = torch.tensor(ex.mask[1:], dtype=torch.bool)
        nll = nll + torch.nn.functional.cross_entropy(
            logits[keep], ids[0, 1:][keep], reduction="sum"
        )
        count += int(keep.sum())
    return nll / count


def grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("max_tokens", [1, 40, 100_000])
def test_micro_batched_gradient_equals_full_logits_gradient(max_tokens):
    batch = examples(9)
    model = small_model()
    want = reference_loss(model, batch)
    want.backward()
    expected = grads(model)
    model.zero_grad(set_to_none=True)
    got = sft_backward(model, batch, max_tokens)
    assert got == pytest.approx(float(want.detach()), rel=1e-5)
    for g, e in zip(grads(model), expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-6)


def test_micro_batches_respect_the_budget_and_keep_every_example():
    batch = examples(20, seed=1)
    parts = micro_batches(batch, 64)
    assert sorted(id(e) for p in parts for e in p) == sorted(id(e) for e in batch)
    for part in parts:
        assert len(part) == 1 or max(len(e.token_ids) for e in part) * len(part) <= 64


def test_masked_logprobs_only_scores_trained_tokens():
    batch = examples(3, seed=2)
    lp = masked_logprobs(small_model(), batch)
    assert lp.shape == (sum(sum(e.mask[1:]) for e in batch),)
    assert bool((lp < 0).all())


def test_sft_train_lowers_the_loss_and_refuses_a_bad_budget():
    model = small_model()
    data = examples(8, seed=3)
    losses = sft_train(model, data, epochs=8, lr=1e-2, batch_size=4, micro_batch_tokens=50)
    assert losses[-1] < losses[0] * 0.8
    with pytest.raises(ValueError, match="micro_batch_tokens must be >= 1"):
        sft_train(model, data, micro_batch_tokens=0)


def test_default_full_logits_loss_matches_the_micro_batched_one():
    from looprl.sft.train import full_logits_loss

    batch = examples(6, seed=4)
    model = small_model()
    assert float(full_logits_loss(model, batch).detach()) == pytest.approx(
        float(reference_loss(model, batch).detach()), rel=1e-6
    )
    assert sft_backward(model, batch, 30) == pytest.approx(
        float(full_logits_loss(model, batch).detach()), rel=1e-5
    )


def test_sft_steps_the_trainers_adamw_warm_up_then_cosine_to_zero():
    optim = sft_optim(1e-3, steps=20, warmup_frac=0.1)  # warm-up: int(20 * 0.1) = 2 steps
    assert (optim.beta2, optim.weight_decay, optim.grad_clip) == (0.95, 0.0, 1.0)
    opt = make_optimizer(torch.nn.Linear(1, 1), None, optim)
    sched = make_scheduler(opt, optim, 20)
    lrs = []
    for _ in range(20):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # warm-up: 1/2 then 2/2 of the peak; the cosine then runs over the other 18 steps, so step
    # 2 is its start (the peak) and step 11 its middle: 0.5 * (1 + cos(pi * 9/18)) = 0.5
    assert lrs[:3] == pytest.approx([5e-4, 1e-3, 1e-3])
    assert lrs[11] == pytest.approx(5e-4)
    assert lrs[19] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 17 / 18)))
    assert sft_optim(1e-3, steps=3, warmup_frac=0.05).warmup_steps == 1  # never zero


def test_a_batch_too_large_for_full_logits_is_micro_batched_by_default(monkeypatch):
    """Without --micro-batch-tokens a batch whose logits (B x T x V) pass FULL_LOGITS_MAX takes
    the micro-batched path; a small one (the demo's) keeps the full-logits pass."""
    from looprl.sft import train as sft

    batch, model = examples(9), small_model()
    padded_logits = len(batch) * max(len(e.token_ids) for e in batch) * model.config.vocab_size
    assert sft.auto_micro_batch_tokens(model, batch) is None  # far below 512 MiB of logits
    monkeypatch.setattr(sft, "FULL_LOGITS_MAX", padded_logits - 1)
    assert sft.auto_micro_batch_tokens(model, batch) == sft.AUTO_MICRO_BATCH_TOKENS
    taken = []
    monkeypatch.setattr(sft, "full_logits_loss", lambda *a: taken.append("full"))
    real_micro = sft.micro_batches
    monkeypatch.setattr(sft, "micro_batches", lambda b, n: taken.append(n) or real_micro(b, n))
    want = float(reference_loss(model, batch))
    assert sft_backward(model, batch, None) == pytest.approx(want, rel=1e-5)
    assert taken == [sft.AUTO_MICRO_BATCH_TOKENS]
