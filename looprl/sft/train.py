"""Supervised warm-start: train on assistant turns of conversations (JSONL), masking everything else.

The step uses the RL trainer's kit: AdamW and the schedule from `looprl.trainer.setup` (configured
by an `OptimSection`), micro-batching and padding from `looprl.trainer.batch`, and the token
scoring of `looprl.models.forward`. Only the loss differs: mean NLL over assistant tokens.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from looprl.files import iter_jsonl
from looprl.models.forward import target_rows
from looprl.rendering.renderer import Renderer
from looprl.trainer.batch import micro_batches, pad_right
from looprl.trainer.config import OptimSection
from looprl.trainer.setup import make_optimizer, make_scheduler
from looprl.types import Message


@dataclass
class SFTExample:
    """Token ids of one rendered conversation and the loss mask (1 on assistant tokens)."""

    token_ids: list[int]
    mask: list[int]


_ONE_CONVERSATION = 'each line must be one conversation, an object with a "messages" list'


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
    for n, row in iter_jsonl(path, fix=_ONE_CONVERSATION):
        if not isinstance(row.get("messages"), list):
            raise ValueError(f"{path}:{n}: not a conversation; {_ONE_CONVERSATION}")
        _check_messages(row["messages"], f"{path}:{n}")
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


def sft_optim(lr: float, steps: int, warmup_frac: float) -> OptimSection:
    """SFT's optimizer and schedule, in the RL trainer's terms.

    AdamW with beta2 0.95 (nanoGPT's; the RL default is 0.99) and no weight decay; linear
    warm-up over `warmup_frac` of the steps (at least one), then cosine decay to zero; gradients
    clipped to a global norm of 1.
    """
    warm = max(1, int(steps * warmup_frac))
    return OptimSection(
        lr=lr, beta2=0.95, weight_decay=0.0, warmup_steps=warm, schedule="cosine", grad_clip=1.0
    )


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
    """Masked next-token cross-entropy with `sft_optim`'s AdamW and schedule; the loss per step.

    With `micro_batch_tokens`, each batch is cut into micro-batches of at most that many padded
    tokens (one example per micro-batch when it is longer) whose gradients are accumulated, and
    the vocabulary projection runs on trained positions only: the same loss in bounded memory.
    Without it (the default) the batch is one full-logits pass (`full_logits_loss`) while its
    logits stay under `FULL_LOGITS_MAX`, and micro-batched otherwise.
    """
    if micro_batch_tokens is not None and micro_batch_tokens < 1:
        raise ValueError(f"micro_batch_tokens must be >= 1, got {micro_batch_tokens}")
    steps = max(1, math.ceil(len(examples) * epochs / batch_size))
    optim = sft_optim(lr, steps, warmup_frac)
    opt = make_optimizer(model, None, optim)
    sched = make_scheduler(opt, optim, steps)
    losses: list[float] = []
    log_every = max(1, min(20, steps // 10))
    model.train()
    t0 = time.perf_counter()
    for step, chunk in enumerate(_shuffled_batches(len(examples), batch_size, steps, seed)):
        opt.zero_grad(set_to_none=True)
        losses.append(sft_backward(model, [examples[i] for i in chunk], micro_batch_tokens))
        torch.nn.utils.clip_grad_norm_(model.parameters(), optim.grad_clip)
        opt.step()
        sched.step()
        if log is not None and (step % log_every == 0 or step == steps - 1):
            log(step + 1, steps, losses[-1], time.perf_counter() - t0)
    model.eval()
    return losses


def _shuffled_batches(n: int, batch_size: int, steps: int, seed: int) -> Iterator[list[int]]:
    """`steps` batches of example indices: epoch after epoch, each a fresh shuffle of all `n`."""
    rng = random.Random(seed)
    order: list[int] = []
    for _ in range(steps):
        if len(order) < batch_size:
            perm = list(range(n))
            rng.shuffle(perm)
            order += perm
        chunk, order = order[:batch_size], order[batch_size:]
        yield chunk


FULL_LOGITS_MAX = 2**27
"""Logits (batch x padded length x vocabulary) above which a batch is micro-batched by default:
512 MiB of float32, where the full-logits pass starts to cost more time and memory than it saves."""

AUTO_MICRO_BATCH_TOKENS = 2048
"""Padded tokens per micro-batch when a batch is micro-batched by default."""


def auto_micro_batch_tokens(model: torch.nn.Module, batch: list[SFTExample]) -> int | None:
    """None (one full-logits pass) when the batch's full logits stay under `FULL_LOGITS_MAX`,
    else `AUTO_MICRO_BATCH_TOKENS`: long conversations and large vocabularies take the
    micro-batched path without being asked (short ones, as in the demo, keep the full pass)."""
    vocab = int(getattr(getattr(model, "config", None), "vocab_size", 0) or 0)
    padded = len(batch) * max(len(e.token_ids) for e in batch)
    return AUTO_MICRO_BATCH_TOKENS if padded * vocab > FULL_LOGITS_MAX else None


def sft_backward(model: torch.nn.Module, batch: list[SFTExample], max_tokens: int | None) -> float:
    """Backward of the mean NLL over the batch's trained tokens; returns that loss.

    With `max_tokens`, micro-batch by micro-batch (`looprl.trainer.batch.micro_batches`, as the
    RL update cuts its batches): the gradient is the same as one pass over the whole batch.
    Without, one `full_logits_loss` pass, unless the batch is too large for it
    (`auto_micro_batch_tokens`).
    """
    if max_tokens is None:
        max_tokens = auto_micro_batch_tokens(model, batch)
    if max_tokens is None:
        full = full_logits_loss(model, batch)
        full.backward()
        return float(full.detach())
    total = max(1, sum(sum(e.mask[1:]) for e in batch))
    loss = 0.0
    for part in micro_batches(batch, max_tokens):
        part_loss = -masked_logprobs(model, part).sum() / total
        part_loss.backward()
        loss += float(part_loss.detach())
    return loss


def _padded(model: torch.nn.Module, batch: list[SFTExample]) -> tuple[torch.Tensor, ...]:
    """(ids, attention mask, loss mask), each (B, T), on the model's device (`pad_right`).

    The pad id is 0: padded positions have attention 0 and loss mask 0, so any id would do.
    """
    device = next(model.parameters()).device
    return tuple(t.to(device) for t in pad_right(batch, pad_id=0))


def full_logits_loss(model: torch.nn.Module, batch: list[SFTExample]) -> torch.Tensor:
    """Mean NLL over the batch's trained tokens from the full logits, in one pass.

    It holds (batch x length x vocabulary) logits, so bound memory with `micro_batch_tokens`
    for long conversations or large vocabularies.
    """
    # the default because its floats differ from `masked_logprobs`' (about 1e-8 relative, one
    # log-softmax over every position vs the head on trained rows) and the demo's table is
    # measured with them
    ids, attn, mask = _padded(model, batch)  # (B, T) each
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    m = mask[:, 1:]  # (B, T-1)
    return (nll * m).sum() / m.sum().clamp(min=1.0)


def masked_logprobs(model: torch.nn.Module, batch: list[SFTExample]) -> torch.Tensor:
    """Log-probabilities of the trained tokens of `batch`, flattened (N,).

    The output projection runs on trained positions only, chunk by chunk (as in the RL update),
    so memory does not grow with vocabulary x sequence length.
    """
    ids, attn, mask = _padded(model, batch)  # (B, T) each
    rows, _ = target_rows(model, ids, attn, ids[:, 1:], mask[:, 1:])  # (N, 2)
    return rows[:, 0]  # (N,)


def examples_from_rows(
    renderer_for: Any, rows: Iterable[dict[str, Any]], eos_text: str
) -> list[SFTExample]:
    """Encode rows; `renderer_for(tools)` gives the renderer offering that row's tools."""
    out = []
    for row in rows:
        messages = [Message.from_dict(m) for m in row["messages"]]
        out.append(encode_conversation(renderer_for(row.get("tools") or []), messages, eos_text))
    return out


def sft_model(
    model_name: str,
    rows: list[dict[str, Any]],
    output: Path,
    *,
    epochs: float,
    lr: float,
    batch_size: int,
    seed: int,
    micro_batch_tokens: int | None = None,
    log: Any = None,
    on_start: Callable[[int, int], None] | None = None,
    chat_template: str | None = None,
) -> int:
    """Load `model_name`, train it on `rows` (`read_conversations`' rows) with `sft_train`, and
    export it to `output` as a Hugging Face model (atomically); the optimizer steps taken.

    `log(step, total, loss, seconds)` is called as `sft_train` calls it; `on_start(conversations,
    trained_tokens)` once the rows are encoded, before the first step. `chat_template` replaces
    the tokenizer's (`looprl.rendering.templates.set_chat_template`; None keeps it).
    """
    from looprl.models.loading import load_model
    from looprl.rendering.templates import set_chat_template
    from looprl.trainer.checkpoint.single import export_hf
    from looprl.trainer.setup import seed_everything

    seed_everything(seed)
    model, tokenizer = load_model(model_name)
    set_chat_template(tokenizer, chat_template)
    examples = examples_from_rows(
        lambda tools: Renderer(tokenizer, tools), rows, tokenizer.eos_token
    )
    if on_start is not None:
        on_start(len(examples), sum(sum(e.mask) for e in examples))
    losses = sft_train(
        model, examples, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed,
        micro_batch_tokens=micro_batch_tokens, log=log,
    )  # fmt: skip
    export_hf(model, tokenizer, output)
    return len(losses)
