"""Log-probabilities and entropy of sampled tokens, from logits or from hidden states and a head.

Memory-bounded: rows are scored in chunks of `chunk_size` tokens in float32, each chunk
recomputed in backward (activation checkpointing), so no full (N, V) softmax is held for the
backward pass whatever the vocabulary. Always score at the sampler's temperature so ratios
compare like with like.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint


def _chunked_rows(
    fn: Callable[..., Tensor], logits: Tensor, *extra: Tensor, chunk_size: int
) -> Tensor:
    """Apply fn to row chunks of (N, V) logits (and matching (N,) extras); recompute in backward.

    Activation checkpointing per chunk keeps only one chunk's float32 intermediates alive, instead
    of a full (N, V) softmax held for the backward pass.
    """
    if logits.shape[0] == 0:
        return logits.new_zeros(0)
    outs = []
    # split, not slicing: a slice's backward writes into a zeroed (N, V) buffer per chunk
    chunks = zip(logits.split(chunk_size), *(e.split(chunk_size) for e in extra), strict=True)
    for args in chunks:
        if torch.is_grad_enabled() and logits.requires_grad:
            outs.append(checkpoint(fn, *args, use_reentrant=False))
        else:
            outs.append(fn(*args))
    return torch.cat(outs)


def _entropy_rows(logits: Tensor, temperature: float) -> Tensor:
    """Entropy of softmax(logits / temperature) for (n, V) rows: logsumexp(z) - sum p z."""
    z = logits.float() / temperature  # (n, V)
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)  # (n,)


def entropy_from_logits(logits: Tensor, temperature: float = 1.0, chunk_size: int = 1024) -> Tensor:
    """Per-token entropy of the sampling distribution softmax(logits / temperature): (B, T, V) -> (B, T).

    Computed in row chunks of `chunk_size` tokens in float32, with per-chunk recomputation in
    backward, so memory stays bounded for large vocabularies. Differentiable (entropy bonus).
    """
    b, t, v = logits.shape
    flat = _chunked_rows(
        lambda x: _entropy_rows(x, temperature), logits.reshape(b * t, v), chunk_size=chunk_size
    )
    return flat.reshape(b, t)  # (B, T)


def _logprob_rows(logits: Tensor, ids: Tensor, temperature: float) -> Tensor:
    """log softmax(logits / temperature)[id] for (n, V) rows, without materialising log_softmax."""
    z = logits.float() / temperature  # (n, V)
    return z.gather(-1, ids[:, None]).squeeze(-1) - torch.logsumexp(z, dim=-1)  # (n,)


def logprobs_from_logits(
    logits: Tensor, token_ids: Tensor, temperature: float = 1.0, chunk_size: int = 1024
) -> Tensor:
    """Log-probability of each token under softmax(logits / temperature): (B, T, V), (B, T) -> (B, T).

    `logits[:, t]` must be the distribution that produced `token_ids[:, t]` (the caller shifts the
    model output by one). Use the sampler's temperature so ratios compare like with like.
    """
    b, t, v = logits.shape
    flat = _chunked_rows(
        lambda x, ids: _logprob_rows(x, ids, temperature),
        logits.reshape(b * t, v),
        token_ids.reshape(b * t).long(),
        chunk_size=chunk_size,
    )
    return flat.reshape(b, t)  # (B, T)


def head_logprobs_entropy(
    hidden: Tensor,
    head: Callable[[Tensor], Tensor],
    token_ids: Tensor,
    temperature: float = 1.0,
    chunk_size: int = 1024,
) -> Tensor:
    """Log-probability and entropy per row from hidden states, never holding all (N, V) logits.

    `hidden` (N, H) are the states that predict `token_ids` (N,); `head` maps them to logits
    (the model's output projection). Each chunk of rows is projected, scored and (in backward)
    recomputed on its own, so memory is one chunk's logits whatever the vocabulary. Returns (N, 2):
    column 0 the log-probability at `temperature`, column 1 the entropy of that distribution.
    """

    def rows(h: Tensor, ids: Tensor) -> Tensor:
        z = head(h).float() / temperature  # (n, V)
        lse = torch.logsumexp(z, dim=-1)  # (n,)
        lp = z.gather(-1, ids[:, None]).squeeze(-1) - lse  # (n,)
        ent = lse - (torch.softmax(z, dim=-1) * z).sum(dim=-1)  # (n,)
        return torch.stack([lp, ent], dim=-1)  # (n, 2)

    if hidden.shape[0] == 0:
        return hidden.new_zeros((0, 2), dtype=torch.float32)
    return _chunked_rows(rows, hidden, token_ids.long(), chunk_size=chunk_size)  # (N, 2)
