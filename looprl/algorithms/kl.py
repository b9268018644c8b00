"""KL estimators, sampler/trainer mismatch corrections, and logprob / entropy from logits.

All functions work per token on (B, T) tensors. Sampled-token KL estimators follow Schulman,
"Approximating KL Divergence" (2020, http://joschu.net/blog/kl-approx.html); truncated
importance sampling (TIS) follows Yao et al., "Your efficient RL framework secretly brings you
off-policy RL training" (2025), as adopted by veRL and others.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

KLFn = Callable[..., Tensor]
_LOG_RATIO_CLAMP = 20.0  # keeps exp() finite when two policies disagree wildly on a token


def _masked(x: Tensor, mask: Tensor | None) -> Tensor:
    """x with 0 where mask is 0 (no-op without a mask)."""
    return x if mask is None else torch.where(mask > 0, x, 0.0)


def kl_k1(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor | None = None) -> Tensor:
    """k1 = log pi - log pi_ref per token: unbiased for KL(pi || pi_ref) on tokens sampled from pi.

    High variance and negative on some tokens; (B, T), 0 where mask is 0.
    """
    return _masked(logprobs - ref_logprobs, mask)  # (B, T)


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor | None = None) -> Tensor:
    """k3 = r - 1 - log r with r = pi_ref / pi per token: unbiased for KL(pi || pi_ref), always >= 0.

    The estimator GRPO uses (arXiv:2402.03300, eq. 4). Departure: log r is clamped to +-20 so a
    wild token cannot overflow. (B, T), 0 where mask is 0.
    """
    log_r = (ref_logprobs - logprobs).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)  # (B, T)
    return _masked(torch.exp(log_r) - 1.0 - log_r, mask)  # (B, T)


KL_ESTIMATORS: dict[str, KLFn] = {"k1": kl_k1, "k3": kl_k3}


@torch.no_grad()
def truncated_importance_weights(
    trainer_old_logprobs: Tensor, sampler_logprobs: Tensor, cap: float = 2.0
) -> Tensor:
    """TIS weights min(pi_trainer / pi_sampler, cap) per token, detached: (B, T).

    The sampler (vLLM, a batched KV-cache engine) and the trainer compute slightly different
    probabilities for the same weights; multiplying the policy loss by these weights corrects
    the bias, and the cap bounds the variance. Departure: the log ratio is clamped to +-20.
    """
    log_w = (trainer_old_logprobs - sampler_logprobs).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return torch.exp(log_w).clamp(max=cap)  # (B, T)


@torch.no_grad()
def mismatch_kl(trainer_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor) -> Tensor:
    """k3 estimate of KL(sampler || trainer), averaged over trained tokens: a 0-dim metric.

    Tokens were drawn from the sampler, so r = pi_trainer / pi_sampler. Near 0 when both agree;
    a rising value means the engine and the trainer disagree (precision, kernels, stale weights).
    """
    k3 = kl_k3(sampler_logprobs, trainer_logprobs, mask)  # (B, T)
    return k3.sum() / mask.float().sum().clamp(min=1.0)  # ()


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
