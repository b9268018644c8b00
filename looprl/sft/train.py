"""Supervised warm-start: train on assistant turns of conversations (JSONL), masking everything else."""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from looprl.models.forward import target_rows
from looprl.rendering.renderer import Renderer
from looprl.types import EpisodeResult, Message


@dataclass
class SFTExample:
    """Token ids of one rendered conversation and the loss mask (1 on assistant tokens)."""

    token_ids: list[int]
    mask: list[int]


def read_conversations(path: Path) -> list[dict[str, Any]]:
    """Read a JSONL file of `{"messages": [...], "tools": [...]}` rows (OpenAI message format).

    Raises ValueError naming the file, the line and the fix for a missing file, a line that is
    not JSON, or a row that is not a conversation.
    """
    if not path.is_file():
        raise ValueError(
            f"SFT data {path} does not exist; pass the JSONL file of conversations, e.g. one "
            "written by looprl eval ENV --policy MODULE:FN --save-sft FILE"
        )
    rows = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"{path}:{i}: not valid JSON ({exc.msg}); each line must be one conversation"
            ) from None
        if not isinstance(row, dict) or not isinstance(row.get("messages"), list):
            raise ValueError(
                f'{path}:{i}: not a conversation; each line must be an object with a "messages" list'
            )
        _check_messages(row["messages"], f"{path}:{i}")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path} holds no conversations; give a JSONL file with one per line")
    return rows


def _check_messages(messages: list[Any], where: str) -> None:
    roles = ("system", "user", "assistant", "tool")
    for j, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in roles:
            raise ValueError(
                f"{where}: message {j} is not a message; each needs a role of {list(roles)}"
            )
        try:
            Message.from_dict(m)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"{where}: message {j} is malformed ({type(exc).__name__}: {exc}); write it in "
                "the OpenAI message format"
            ) from None
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError(f"{where}: no assistant message; a conversation needs one to learn from")


def traces_from_episodes(
    env: Any, episodes: Iterable[EpisodeResult], threshold: float
) -> list[dict[str, Any]]:
    """`looprl sft` rows (messages and the task's tools) of the episodes that reached `threshold`.

    Episodes with errors are left out: a trace teaches what the model should write, so it must
    have run cleanly and been scored.
    """
    rows = []
    for ep in episodes:
        if ep.errors or not ep.rewards or ep.reward < threshold - 1e-9:
            continue
        tools = env.for_task(ep.task).tool_schemas
        rows.append({"messages": [m.to_template() for m in ep.messages], "tools": tools})
    return rows


def encode_conversation(renderer: Renderer, messages: list[Message], eos_text: str) -> SFTExample:
    """Render a conversation; mark each assistant turn's tokens (content + end-of-turn) as trained.

    The mask is built turn by turn with the same prefix property the rollout relies on, so the
    model learns exactly the tokens it would sample, not the template glue after them.
    """
    ids: list[int] = []
    mask: list[int] = []
    tail = renderer.closing[len(eos_text) :] if renderer.closing.startswith(eos_text) else ""
    tail_ids = renderer.encode(tail) if tail else []
    for i, msg in enumerate(messages):
        if msg.role != "assistant":
            continue
        prompt = renderer.render_ids(messages[:i], add_generation_prompt=True)
        full = renderer.render_ids(messages[: i + 1], add_generation_prompt=False)
        if prompt[: len(ids)] != ids or full[: len(prompt)] != prompt:
            raise ValueError(
                "the chat template is not prefix-safe for this conversation; cannot mask turns"
            )
        mask += [0] * (len(prompt) - len(ids))
        turn = full[len(prompt) :]
        n_tail = len(tail_ids) if tail_ids and turn[-len(tail_ids) :] == tail_ids else 0
        mask += [1] * (len(turn) - n_tail) + [0] * n_tail
        ids = full
    if not ids:
        raise ValueError("a conversation has no assistant message to learn from")
    return SFTExample(ids, mask)


def sft_train(
    model: torch.nn.Module,
    examples: list[SFTExample],
    *,
    epochs: float = 1.0,
    lr: float = 1e-3,
    batch_size: int = 16,
    seed: int = 0,
    warmup_frac: float = 0.05,
    micro_batch_tokens: int | None = None,
    log: Any = None,
) -> list[float]:
    """Masked next-token cross-entropy with AdamW and a cosine schedule; returns the loss per step.

    With `micro_batch_tokens`, each batch is cut into micro-batches of at most that many padded
    tokens (one example per micro-batch when it is longer) whose gradients are accumulated, and
    the vocabulary projection runs on trained positions only: the same loss in bounded memory.
    Without it (the default) the batch is one full-logits pass, as originally implemented.
    """
    if micro_batch_tokens is not None and micro_batch_tokens < 1:
        raise ValueError(f"micro_batch_tokens must be >= 1, got {micro_batch_tokens}")
    rng = random.Random(seed)
    steps = max(1, math.ceil(len(examples) * epochs / batch_size))
    opt = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=lr,
        weight_decay=0.0,
        betas=(0.9, 0.95),
    )
    warm = max(1, int(steps * warmup_frac))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (
            (s + 1) / warm
            if s < warm
            else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, steps - warm)))
        ),
    )
    order: list[int] = []
    losses: list[float] = []
    log_every = max(1, min(20, steps // 10))
    model.train()
    t0 = time.perf_counter()
    for step in range(steps):
        if len(order) < batch_size:
            perm = list(range(len(examples)))
            rng.shuffle(perm)
            order += perm
        chunk, order = order[:batch_size], order[batch_size:]
        batch = [examples[i] for i in chunk]
        opt.zero_grad(set_to_none=True)
        if micro_batch_tokens is None:
            full = full_logits_loss(model, batch)
            full.backward()
            loss = float(full.detach())
        else:
            loss = sft_backward(model, batch, micro_batch_tokens)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss)
        if log is not None and (step % log_every == 0 or step == steps - 1):
            log(step + 1, steps, losses[-1], time.perf_counter() - t0)
    model.eval()
    return losses


def _pad(batch: list[SFTExample], device: torch.device) -> tuple[torch.Tensor, ...]:
    """(ids, attention mask, loss mask) padded to the longest example, each (B, T)."""
    t_max = max(len(e.token_ids) for e in batch)
    ids = torch.zeros((len(batch), t_max), dtype=torch.long)
    attn = torch.zeros_like(ids)
    mask = torch.zeros((len(batch), t_max), dtype=torch.bool)
    for i, e in enumerate(batch):
        n = len(e.token_ids)
        ids[i, :n] = torch.tensor(e.token_ids)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(e.mask, dtype=torch.bool)
    return ids.to(device), attn.to(device), mask.to(device)


def full_logits_loss(model: torch.nn.Module, batch: list[SFTExample]) -> torch.Tensor:
    """Mean NLL over the batch's trained tokens from the full logits, in one pass.

    The original implementation, kept as the default so earlier results (the demo's) reproduce
    bit for bit; it holds (batch x length x vocabulary) logits, so bound memory with
    `micro_batch_tokens` for long conversations or large vocabularies.
    """
    ids, attn, mask = _pad(batch, next(model.parameters()).device)
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    m = mask[:, 1:].float()
    return (nll * m).sum() / m.sum().clamp(min=1.0)


def masked_logprobs(model: torch.nn.Module, batch: list[SFTExample]) -> torch.Tensor:
    """Log-probabilities of the trained tokens of `batch`, flattened (N,).

    The output projection runs on trained positions only, chunk by chunk (as in the RL update),
    so memory does not grow with vocabulary x sequence length.
    """
    ids, attn, mask = _pad(batch, next(model.parameters()).device)
    sel = mask[:, 1:]  # token t+1 is predicted from position t
    rows, _ = target_rows(model, ids, attn, ids[:, 1:], sel)  # (N, 2)
    return rows[:, 0]  # (N,)


def micro_batches(batch: list[SFTExample], max_tokens: int) -> list[list[SFTExample]]:
    """Split `batch` (sorted by length) so each part's padded size stays within `max_tokens`."""
    parts: list[list[SFTExample]] = []
    for ex in sorted(batch, key=lambda e: len(e.token_ids)):
        if parts and len(ex.token_ids) * (len(parts[-1]) + 1) <= max_tokens:
            parts[-1].append(ex)
        else:
            parts.append([ex])
    return parts


def sft_backward(model: torch.nn.Module, batch: list[SFTExample], max_tokens: int) -> float:
    """Backward of the mean NLL over the batch's trained tokens, micro-batch by micro-batch.

    Returns the loss; the gradient is the same as one pass over the whole batch.
    """
    total = max(1, sum(sum(e.mask[1:]) for e in batch))
    loss = 0.0
    for part in micro_batches(batch, max_tokens):
        part_loss = -masked_logprobs(model, part).sum() / total
        part_loss.backward()
        loss += float(part_loss.detach())
    return loss


def examples_from_rows(
    renderer_for: Any, rows: Iterable[dict[str, Any]], eos_text: str
) -> list[SFTExample]:
    """Encode rows; `renderer_for(tools)` gives the renderer offering that row's tools."""
    out = []
    for row in rows:
        messages = [Message.from_dict(m) for m in row["messages"]]
        out.append(encode_conversation(renderer_for(row.get("tools") or []), messages, eos_text))
    return out
