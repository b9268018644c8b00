"""Loss aggregations with padding, and micro-batch accumulation with global normalizers."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from looprl.algorithms import (
    AGGREGATIONS,
    batch_normalizer,
    constant_normalizer,
    sequence_mean,
    token_mean,
)

# Padding positions hold garbage (100) that must never reach the result.
LOSS = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 100.0, 100.0, 100.0], [5.0, 5.0, 5.0, 5.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])


def test_token_mean_with_padding() -> None:
    assert float(token_mean(LOSS, MASK)) == pytest.approx(10 / 4)


def test_sequence_mean_with_padding_skips_empty_sequences() -> None:
    assert float(sequence_mean(LOSS, MASK)) == pytest.approx((2.0 + 4.0) / 2)


def test_constant_normalizer_with_padding() -> None:
    assert float(constant_normalizer(LOSS, MASK)) == pytest.approx(10 / (3 * 4))


def test_explicit_normalizers() -> None:
    assert float(token_mean(LOSS, MASK, normalizer=8.0)) == pytest.approx(10 / 8)
    assert float(sequence_mean(LOSS, MASK, normalizer=4.0)) == pytest.approx(6 / 4)
    assert float(constant_normalizer(LOSS, MASK, normalizer=30.0)) == pytest.approx(10 / 30)


def test_all_masked_batch_is_zero_not_nan() -> None:
    empty = torch.zeros(2, 3)
    for name, fn in AGGREGATIONS.items():
        assert float(fn(torch.ones(2, 3), empty)) == 0.0, name
        assert batch_normalizer(name, [empty]) >= 1.0


def test_batch_normalizer_counts() -> None:
    masks = [MASK, torch.tensor([[1, 1], [0, 0]])]
    assert batch_normalizer("token_mean", masks) == 6.0
    assert batch_normalizer("sequence_mean", masks) == 3.0
    assert batch_normalizer("constant_normalizer", masks) == 5 * 4.0  # longest padded length 4
    assert batch_normalizer("constant_normalizer", masks, max_len=10) == 50.0
    with pytest.raises(ValueError, match="unknown aggregation 'nope'; choose one of"):
        batch_normalizer("nope", masks)


@pytest.mark.parametrize("name", sorted(AGGREGATIONS))
def test_micro_batches_with_global_normalizer_equal_full_batch(name: str) -> None:
    torch.manual_seed(0)
    lengths = [5, 1, 7, 3, 0, 6]
    mask = torch.zeros(6, 7)
    for i, n in enumerate(lengths):
        mask[i, 7 - n :] = 1.0  # left-padded, different lengths
    weights = torch.randn(6, 7, requires_grad=True)
    agg = AGGREGATIONS[name]
    full = agg(weights**2, mask, normalizer=batch_normalizer(name, [mask], max_len=7))
    full.backward()
    assert weights.grad is not None
    full_grad = weights.grad.clone()
    weights.grad = None
    # micro-batches trimmed to their own padded length: T differs between them
    parts = [(0, 2), (2, 3), (3, 6)]
    masks = []
    for lo, hi in parts:
        width = max(int(mask[lo:hi].sum(1).max()), 1)
        masks.append(mask[lo:hi, 7 - width :])
    norm = batch_normalizer(name, masks, max_len=7)
    total = torch.zeros(())
    for (lo, hi), m in zip(parts, masks, strict=True):
        part = agg(weights[lo:hi, 7 - m.shape[1] :] ** 2, m, normalizer=norm)
        part.backward()
        total = total + part.detach()
    assert_close(total, full.detach())
    assert_close(weights.grad, full_grad)
