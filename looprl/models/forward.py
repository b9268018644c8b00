"""Scoring tokens with a causal LM: log-probabilities (and entropy) of the target tokens only.

Shared by the RL update and SFT. Takes plain tensors, so it knows nothing of trainer records:
`input_ids` and `attention_mask` are (B, T), `targets` and `target_mask` are (B, T-1) and
describe the tokens `input_ids[:, 1:]` predicted from positions 0..T-2.

For model types whose logits are exactly `head(decoder(x))` the output projection runs on the
selected positions alone, chunk by chunk (`head_logprobs_entropy`), so neither the prompt's nor
the tools' tokens pay for the vocabulary. Other models take their own forward and their logits
as they are (logit scaling or soft-capping included). `target_rows` returns the (N, 2) scores at
the selected positions (SFT sums them); `forward_logprobs` lays them back out as (B, T-1) (the RL
update).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from looprl.algorithms.logprobs import head_logprobs_entropy

# model types whose logits are exactly lm_head(decoder(x)): no logit scaling or soft-capping
_FUSED_HEAD_TYPES = {"llama", "qwen2", "qwen3", "mistral"}


class TokenScores(NamedTuple):
    """What `forward_logprobs` returns; 0 at positions outside `target_mask`."""

    logprobs: Tensor  # (B, T-1)
    entropy: Tensor | None  # (B, T-1), only with with_entropy
    hidden: Tensor | None  # (B, T-1, H) last hidden states, only with with_hidden


def decoder_and_head(model: torch.nn.Module) -> tuple[Any, Any] | None:
    """(decoder trunk, output projection) when logits are exactly head(trunk(x)), else None.

    Works through a PEFT wrapper (attribute access reaches the base model, LoRA layers stay in
    the trunk). Model types with logit scaling or soft-capping take the plain path.
    """
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in _FUSED_HEAD_TYPES:
        return None
    try:
        return model.get_decoder(), model.get_output_embeddings()  # type: ignore[operator]
    except (AttributeError, NotImplementedError):
        return None


def target_rows(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    targets: Tensor,
    target_mask: Tensor,
    temperature: float = 1.0,
    *,
    with_hidden: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Log-probability and entropy of the N targets where `target_mask` is set, in row-major order.

    Returns (rows (N, 2): column 0 the logprob, column 1 the entropy, at `temperature`; the last
    hidden states (B, T, H) with `with_hidden`, else None). Shapes as in the module docstring.
    """
    sel = target_mask > 0  # (B, T-1)
    parts = decoder_and_head(model)
    if parts is None:  # the model's own forward and head; score its logits as they are
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            output_hidden_states=with_hidden,
            use_cache=False,
        )
        last = out.hidden_states[-1] if with_hidden else None  # (B, T, H)
        rows_in, head = out.logits[:, :-1, :][sel], torch.nn.Identity()  # (N, V)
    else:
        decoder, head = parts
        last = decoder(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state  # (B, T, H)
        rows_in = last[:, :-1, :][sel]  # (N, H)
    rows = head_logprobs_entropy(rows_in, head, targets[sel], temperature)  # (N, 2)
    return rows, last if with_hidden else None


def forward_logprobs(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    targets: Tensor,
    target_mask: Tensor,
    temperature: float = 1.0,
    *,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    with_hidden: bool = False,
) -> TokenScores:
    """Log-probabilities of `targets` under `model` at the sampling `temperature`, as (B, T-1).

    input_ids, attention_mask: (B, T); targets, target_mask: (B, T-1), targets[:, t] is the token
    predicted from position t. Logprobs and entropy are computed only where `target_mask` is set
    (0 elsewhere). The entropy carries gradient only with `entropy_grad` (an entropy bonus).
    """
    sel = target_mask > 0  # (B, T-1)
    rows, last = target_rows(
        model, input_ids, attention_mask, targets, target_mask, temperature, with_hidden=with_hidden
    )  # (N, 2), (B, T, H) or None
    zeros = torch.zeros(sel.shape, dtype=torch.float32, device=sel.device)
    logprobs = zeros.masked_scatter(sel, rows[:, 0])  # (B, T-1)
    entropy = None
    if with_entropy:
        ent = rows[:, 1] if entropy_grad else rows[:, 1].detach()
        entropy = zeros.masked_scatter(sel, ent)  # (B, T-1)
    hidden = last[:, :-1, :] if last is not None else None  # (B, T-1, H)
    return TokenScores(logprobs, entropy, hidden)
