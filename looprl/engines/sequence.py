"""One request inside the torch engine (prompt, settings, sampled tokens, reply hook), its checks, the counters."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from looprl.engines.detokenize import StopStringWatcher
from looprl.engines.prefix_cache import PrefixEntry
from looprl.engines.sampling import RowParams
from looprl.types import Generation, SamplingParams


@dataclass
class SequenceState:
    """One request inside the engine: its prompt, settings, sampled tokens and how to report back."""

    prompt: list[int]
    sampling: SamplingParams
    rng: random.Random
    on_done: Callable[[Generation], None]
    watcher: StopStringWatcher
    started: float = field(default_factory=time.perf_counter)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # the policy version that sampled each token
    cache_len: int = 0  # positions of this sequence held in the KV cache
    cancelled: bool = False
    answered: bool = False
    epoch: int = 0  # weight version the cached keys/values were computed with
    prefix: tuple[int, PrefixEntry] | None = None  # (positions to reuse, entry) until loaded

    def answer(self, gen: Generation) -> None:
        """Report the result once (never to a caller that stopped waiting)."""
        if self.answered or self.cancelled:
            return
        self.answered = True
        gen.seconds = time.perf_counter() - self.started
        self.on_done(gen)

    @property
    def row(self) -> RowParams:
        """Sampling settings for `looprl.engines.sampling.sample`."""
        s = self.sampling
        return RowParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k)


@dataclass
class EngineStats:
    """Counters since the engine started (read them for throughput metrics)."""

    requests: int = 0
    prompt_tokens: int = 0
    prefill_tokens_saved: int = (
        0  # prompt tokens not computed (identical prompt, cached or shared prefix)
    )
    prefix_hits: int = 0  # prompts that started from cached or shared keys/values
    shared_prefills: int = 0  # prefixes common to several new prompts, each prefilled once
    generated_tokens: int = 0
    decode_steps: int = 0
    busy_seconds: float = 0.0
    kv_waits: int = 0  # admissions put off because the KV cache budget was full


def default_stop_ids(model: nn.Module, tokenizer: Any) -> set[int]:
    """Stop token ids: the tokenizer's eos, the generation config's eos ids, and `<|im_end|>` if known."""
    ids: set[int] = set()
    candidates: list[Any] = [getattr(tokenizer, "eos_token_id", None)]
    gen_cfg = getattr(model, "generation_config", None)
    eos = getattr(gen_cfg, "eos_token_id", None)
    candidates.extend(eos if isinstance(eos, list | tuple) else [eos])
    if hasattr(tokenizer, "get_vocab"):
        candidates.append(tokenizer.get_vocab().get("<|im_end|>"))
    ids.update(int(c) for c in candidates if isinstance(c, int))
    return ids


def check_request(
    prompt: list[int] | None, s: SamplingParams, vocab: int, max_len: int
) -> str | None:
    """Why a request cannot run (a message naming the fix), or None when it can."""
    if not prompt:
        return "the request has no prompt_ids; a token-level engine needs the prompt as token ids"
    if len(prompt) >= max_len:
        return (
            f"prompt has {len(prompt)} tokens but the engine's context is {max_len} (max_seq_len); "
            "shorten the conversation or raise max_seq_len"
        )
    if min(prompt) < 0 or max(prompt) >= vocab:
        return f"prompt_ids must lie in [0, {vocab}); got min {min(prompt)}, max {max(prompt)}"
    if s.max_tokens < 1:
        return f"max_tokens must be >= 1, got {s.max_tokens}"
    if s.temperature < 0:
        return f"temperature must be >= 0 (0 = greedy), got {s.temperature}"
    if not 0 < s.top_p <= 1:
        return f"top_p must be in (0, 1], got {s.top_p}"
    if s.top_k < 0:
        return f"top_k must be >= 0 (0 = off), got {s.top_k}"
    return None
