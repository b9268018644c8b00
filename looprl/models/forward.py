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

With `packed` (`Packed`, built by `looprl.trainer.batch.pack_prefixes`) the model runs instead on
a prefix tree of the B sequences: each distinct prefix is one position, at its depth, attending
to its ancestors only, so a prompt shared by a group is forwarded once; the scores are read back
at each sequence's own positions and are those of the per-sequence forward (float rounding aside).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from looprl.algorithms.logprobs import head_logprobs_entropy

# model types whose logits are exactly lm_head(decoder(x)): no logit scaling or soft-capping
_FUSED_HEAD_TYPES = {"llama", "qwen2", "qwen3", "mistral"}


class Packed(NamedTuple):
    """Sequences packed as prefix trees (tries over token ids), one tree per row, right-padded.

    Node i of a row holds the last token of one distinct prefix of the row's sequences; it
    attends to the nodes of that prefix (its ancestors and itself) and sits at position id = its
    depth, so its hidden state is the one that token gets in a forward of the sequence alone.
    """

    input_ids: Tensor  # (R, L) the node tokens, one row per packed row
    position_ids: Tensor  # (R, L) each node's depth (0 at a root)
    allowed: Tensor  # (R, 1, L, L) bool: allowed[r, 0, j, i] when node i is node j or an ancestor
    node_index: Tensor  # (B, T) flat node index (into R * L) of sequence b's token t; 0 on padding


_PACKED_ATTENTION = {"sdpa", "eager"}  # take a 4D mask as given (bool for SDPA, additive eager)


def _sliding_window(config: Any) -> tuple[int | None, bool]:
    """(the window of the model's sliding-window layers or None, whether every layer slides)."""
    window = getattr(config, "sliding_window", None)
    if getattr(config, "model_type", None) == "mistral":  # every layer, when set
        return window, True
    types = getattr(config, "layer_types", None) or []
    if window is None or "sliding_attention" not in types:
        return None, False
    return window, set(types) == {"sliding_attention"}


def tree_attention_mask(model: torch.nn.Module, allowed: Tensor, position_ids: Tensor) -> Tensor:
    """`allowed` (R, 1, L, L) in the form the model's attention takes as a prepared 4D mask.

    SDPA reads a bool mask (True: attend); eager attention adds the mask to its scores, so it gets
    0 where allowed and the float32 minimum elsewhere. A sliding window of W keeps the ancestors
    less than W positions up (as the model's own mask does in a sequence); one mask serves every
    layer, so a model mixing sliding and full layers is packed only while no sequence reaches
    its window. Raises ValueError otherwise, or for an attention implementation that takes no
    4D mask, naming the switch that turns packing off.
    """
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None) or "sdpa"
    fix = "set trainer.shared_prefix=false"
    if impl not in _PACKED_ATTENTION:
        raise ValueError(
            f"shared-prefix packing needs attention that takes a 4D mask "
            f"({sorted(_PACKED_ATTENTION)}), the model uses {impl!r}; {fix}"
        )
    window, every_layer = _sliding_window(config)
    if window is not None and int(position_ids.max()) >= window:
        if not every_layer:
            raise ValueError(
                f"shared-prefix packing cannot give the model's {window}-token sliding-window "
                f"layers and its full layers one mask over {int(position_ids.max()) + 1} "
                f"tokens; {fix}"
            )
        up = position_ids[:, None, :, None] - position_ids[:, None, None, :]  # (R, 1, L, L)
        allowed = allowed & (up < window)
    if impl == "sdpa":
        return allowed
    blocked = torch.finfo(torch.float32).min
    return torch.zeros(allowed.shape, device=allowed.device).masked_fill(~allowed, blocked)


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
    packed: Packed | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Log-probability and entropy of the N targets where `target_mask` is set, in row-major order.

    Returns (rows (N, 2): column 0 the logprob, column 1 the entropy, at `temperature`; the last
    hidden states (B, T, H) with `with_hidden`, else None). Shapes as in the module docstring;
    with `packed` the model runs on its prefix tree instead of `input_ids`, same result.
    """
    sel = target_mask > 0  # (B, T-1)
    if packed is None:
        inputs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask}
    else:
        inputs = {
            "input_ids": packed.input_ids,  # (R, L)
            "attention_mask": tree_attention_mask(model, packed.allowed, packed.position_ids),
            "position_ids": packed.position_ids,  # (R, L)
        }
    parts = decoder_and_head(model)
    if parts is None:  # the model's own forward and head; score its logits as they are
        out = model(**inputs, output_hidden_states=with_hidden, use_cache=False)
        last = out.hidden_states[-1] if with_hidden else None  # (B or R, T or L, H)
        scores, head = out.logits, torch.nn.Identity()  # (B or R, T or L, V)
    else:
        decoder, head = parts
        last = decoder(**inputs, use_cache=False).last_hidden_state  # (B or R, T or L, H)
        scores = last
    if packed is None:
        rows_in = scores[:, :-1, :][sel]  # (N, H or V)
    else:  # each target is predicted at its sequence's previous token's node
        rows_in = scores.flatten(0, 1)[packed.node_index[:, :-1][sel]]  # (N, H or V)
        last = None if last is None else last.flatten(0, 1)[packed.node_index]  # (B, T, H)
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
    packed: Packed | None = None,
) -> TokenScores:
    """Log-probabilities of `targets` under `model` at the sampling `temperature`, as (B, T-1).

    input_ids, attention_mask: (B, T); targets, target_mask: (B, T-1), targets[:, t] is the token
    predicted from position t. Logprobs and entropy are computed only where `target_mask` is set
    (0 elsewhere). The entropy carries gradient only with `entropy_grad` (an entropy bonus).
    With `packed`, the sequences run as that prefix tree (`target_rows`).
    """
    sel = target_mask > 0  # (B, T-1)
    # rows (N, 2); last (B, T, H) or None
    rows, last = target_rows(
        model, input_ids, attention_mask, targets, target_mask, temperature,
        with_hidden=with_hidden, packed=packed,
    )  # fmt: skip
    zeros = torch.zeros(sel.shape, dtype=torch.float32, device=sel.device)
    logprobs = zeros.masked_scatter(sel, rows[:, 0])  # (B, T-1)
    entropy = None
    if with_entropy:
        ent = rows[:, 1] if entropy_grad else rows[:, 1].detach()
        entropy = zeros.masked_scatter(sel, ent)  # (B, T-1)
    hidden = last[:, :-1, :] if last is not None else None  # (B, T-1, H)
    return TokenScores(logprobs, entropy, hidden)
