"""Batched token sampling with per-row temperature, top-p, top-k and per-request random streams.

Each row draws its randomness from one uniform number supplied by its own request (inverse-CDF
sampling), so a request's samples do not depend on which other requests share the batch.

Logprobs are `log_softmax(logits / temperature)` at the chosen token, taken BEFORE top-p / top-k
truncation: that is the policy's own probability at the sampling temperature, which is what a
trainer recomputes (with the same temperature) for importance ratios. Greedy rows (temperature 0)
report `log_softmax(logits)` (temperature 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RowParams:
    """Sampling settings of one row: temperature (0 = greedy), top_p (1 = off), top_k (0 = off)."""

    temperature: float
    top_p: float = 1.0
    top_k: int = 0

    @property
    def truncates(self) -> bool:
        """Whether top-p or top-k removes part of the distribution."""
        return self.temperature > 0 and (self.top_p < 1.0 or self.top_k > 0)


def _inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Index drawn from each row of unnormalised `probs` (n, V) using `uniforms` (n,) in [0, 1)."""
    cdf = torch.cumsum(probs, dim=-1)  # (n, V)
    target = (uniforms * cdf[:, -1]).unsqueeze(-1)  # (n, 1)
    idx = torch.searchsorted(cdf, target, right=True)  # (n, 1); zero-mass entries are never chosen
    return idx.squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def _truncated_draw(
    probs: torch.Tensor, params: list[RowParams], uniforms: torch.Tensor
) -> torch.Tensor:
    """Draw from `probs` (n, V) after top-k then top-p truncation, per row."""
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)  # (n, V)
    vocab = probs.shape[-1]
    ks = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=probs.device)
    ps = torch.tensor([p.top_p for p in params], device=probs.device, dtype=probs.dtype)
    ranks = torch.arange(vocab, device=probs.device)[None, :]  # (1, V)
    keep = ranks < ks[:, None]  # (n, V) top-k
    mass_before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # (n, V) mass of higher-ranked tokens
    keep &= (mass_before < ps[:, None]) | (ranks == 0)  # top-p; the best token always stays
    choice = _inverse_cdf(sorted_p * keep, uniforms)  # (n,) rank in sorted order
    return order.gather(-1, choice[:, None]).squeeze(-1)


def _draw_greedy(logp: torch.Tensor, params: list[RowParams], u: torch.Tensor) -> torch.Tensor:
    """The most likely token of each row."""
    return torch.argmax(logp, dim=-1)


def _draw_plain(logp: torch.Tensor, params: list[RowParams], u: torch.Tensor) -> torch.Tensor:
    """A draw from the whole distribution of each row."""
    return _inverse_cdf(logp.exp(), u)


def _draw_truncated(logp: torch.Tensor, params: list[RowParams], u: torch.Tensor) -> torch.Tensor:
    """A draw after each row's top-k / top-p truncation."""
    return _truncated_draw(logp.exp(), params, u)


DRAWS = {"greedy": _draw_greedy, "plain": _draw_plain, "truncated": _draw_truncated}


def _kind(p: RowParams) -> str:
    """Which entry of DRAWS samples this row."""
    return "greedy" if p.temperature <= 0 else "truncated" if p.truncates else "plain"


def sample(
    logits: torch.Tensor, params: list[RowParams], uniforms: list[float]
) -> tuple[list[int], list[float]]:
    """Sample one token per row of `logits` (n, V); return token ids and their logprobs.

    `uniforms[i]` in [0, 1) is row i's randomness (ignored for greedy rows). A batch whose rows
    are all of one kind (greedy, plain or truncated) is drawn without selecting rows.
    """
    logits = logits.float()
    device = logits.device
    temps = [p.temperature if p.temperature > 0 else 1.0 for p in params]
    if any(t != 1.0 for t in temps):
        logits = logits / torch.tensor(temps, device=device)[:, None]
    logp = torch.log_softmax(logits, dim=-1)  # (n, V)
    u = torch.tensor(uniforms, device=device, dtype=logp.dtype)  # (n,)
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(params):
        groups.setdefault(_kind(p), []).append(i)
    if len(groups) == 1:
        tokens = DRAWS[next(iter(groups))](logp, params, u)  # (n,)
    else:
        tokens = torch.empty(len(params), dtype=torch.long, device=device)
        for kind, idx in groups.items():
            rows = torch.tensor(idx, device=device)
            tokens[rows] = DRAWS[kind](logp[rows], [params[i] for i in idx], u[rows])
    chosen = logp.gather(-1, tokens[:, None]).squeeze(-1)  # (n,)
    return tokens.tolist(), chosen.tolist()
