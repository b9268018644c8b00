"""Loss aggregations: how per-token losses (B, T) become one scalar, and how to accumulate them.

Each aggregation has the signature `(loss_tokens, mask, *, normalizer=None) -> scalar`. Without
`normalizer` it normalises by the counts of the tensor it is given. Gradient accumulation: the
trainer splits one optimizer batch into micro-batches; to make the summed micro-batch losses equal
the loss of the whole batch (same value, same gradient), compute the denominator once over the
whole batch and pass it to every micro-batch:

    norm = batch_normalizer(cfg.aggregation, [mb.mask for mb in micro_batches], max_len=cfg.max_len)
    for mb in micro_batches:
        loss, stats = policy_objective(cfg, ..., mask=mb.mask, normalizer=norm)
        loss.backward()   # no division by the number of micro-batches
    optimizer.step()

With data parallelism, all-reduce (sum) the normalizer over ranks first; DDP then averages
gradients over ranks, so multiply each rank's loss by the world size to keep the global sum.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from torch import Tensor


class AggregationFn(Protocol):
    """A loss aggregation, an entry of AGGREGATIONS: (B, T) loss tokens and mask -> scalar ()."""

    def __call__(
        self, loss_tokens: Tensor, mask: Tensor, *, normalizer: float | None = None
    ) -> Tensor: ...


def token_mean(loss_tokens: Tensor, mask: Tensor, *, normalizer: float | None = None) -> Tensor:
    """Sum over every trained token of the batch / number of trained tokens (DAPO, arXiv:2503.14476).

    Each token weighs the same, so long sequences weigh more. `normalizer` = the global number of
    trained tokens (`batch_normalizer("token_mean", ...)`).
    """
    m = mask.float()  # (B, T)
    denom = normalizer if normalizer is not None else m.sum().clamp(min=1.0)
    return (loss_tokens * m).sum() / denom  # ()


def sequence_mean(loss_tokens: Tensor, mask: Tensor, *, normalizer: float | None = None) -> Tensor:
    """Mean over each sequence's trained tokens, then mean over sequences (GRPO, arXiv:2402.03300).

    Each sequence weighs the same whatever its length (the length bias Dr. GRPO points out).
    Sequences without trained tokens do not count. `normalizer` = the global number of sequences
    with at least one trained token; the per-sequence division is local, so it splits exactly.
    """
    m = mask.float()  # (B, T)
    lengths = m.sum(dim=1)  # (B,)
    per_seq = (loss_tokens * m).sum(dim=1) / lengths.clamp(min=1.0)  # (B,)
    denom = normalizer if normalizer is not None else (lengths > 0).sum().clamp(min=1)
    return per_seq.sum() / denom  # ()


def constant_normalizer(
    loss_tokens: Tensor, mask: Tensor, *, normalizer: float | None = None
) -> Tensor:
    """Sum over all trained tokens / (num_sequences * L), L a constant length (Dr. GRPO, arXiv:2503.20783).

    Neither the sequence's length nor the batch's token count enters the weights, so no length
    bias. Departure: the paper's L is the generation budget; without `normalizer` we use this
    tensor's padded length T. `normalizer` = num_sequences * L for the whole batch
    (`batch_normalizer("constant_normalizer", masks, max_len=L)`).
    """
    m = mask.float()  # (B, T)
    denom = normalizer if normalizer is not None else float(m.shape[0] * m.shape[1])
    return (loss_tokens * m).sum() / max(denom, 1.0)  # ()


AGGREGATIONS: dict[str, AggregationFn] = {
    "token_mean": token_mean,
    "sequence_mean": sequence_mean,
    "constant_normalizer": constant_normalizer,
}


def _count_tokens(mask: Tensor, max_len: int) -> float:
    """Trained tokens in one micro-batch."""
    return float(mask.float().sum())


def _count_sequences(mask: Tensor, max_len: int) -> float:
    """Sequences with at least one trained token in one micro-batch."""
    return float((mask.float().sum(dim=1) > 0).sum())


def _count_slots(mask: Tensor, max_len: int) -> float:
    """Sequences times the constant length L in one micro-batch."""
    return float(mask.shape[0] * max_len)


_COUNTS: dict[str, Callable[[Tensor, int], float]] = {
    "token_mean": _count_tokens,
    "sequence_mean": _count_sequences,
    "constant_normalizer": _count_slots,
}


def batch_normalizer(
    aggregation: str, masks: Sequence[Tensor], *, max_len: int | None = None
) -> float:
    """The denominator of `aggregation` over a whole batch given as micro-batch masks (each (b, t)).

    Pass it as `normalizer=` to every micro-batch so accumulated gradients equal one big batch.
    `max_len` is Dr. GRPO's constant L (default: the longest padded micro-batch length).
    Never returns less than 1, so an all-masked batch gives loss 0, not NaN.
    """
    if aggregation not in _COUNTS:
        raise ValueError(
            f"unknown aggregation {aggregation!r}; choose one of {sorted(AGGREGATIONS)}"
        )
    length = max_len if max_len is not None else max((m.shape[1] for m in masks), default=1)
    return max(sum(_COUNTS[aggregation](m, length) for m in masks), 1.0)
