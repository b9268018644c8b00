"""In-process torch engine: continuous batching over a slot-based KV cache, on CPU or one GPU.

Many rollout coroutines call `TorchEngine.generate` at once. A background worker thread owns the
model loop: each iteration it admits waiting requests into free slots (prefilling them together,
and computing identical prompts only once), then decodes every active sequence by one token. A
sequence that finishes frees its slot, which the next iteration refills. Results go back to the
caller's event loop with `call_soon_threadsafe`, so the event loop never runs the model.

Weights, two modes:

- shared (default): give the engine the trainer's own model. The fast path reads the parameters
  at every step, never copying them, so an optimizer step is visible on the next generation for
  free. Update weights only while nothing is generating, or hold `engine.weights_lock` meanwhile.
- separate copy (asynchronous one-step-ahead training): give the engine its own copy of the model
  and call `engine.sync_weights(trainer_model)` when the trainer has finished a step; the copy
  waits for the current decoding step, then overwrites the engine's parameters in place.

Sampling and logprobs follow `looprl.engines.sampling`: logprobs are `log_softmax(logits / T)` at
the sampled token, before top-p/top-k truncation (temperature 1 for greedy requests).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from looprl.engines.base import GenerationRequest
from looprl.engines.detokenize import StopStringWatcher
from looprl.engines.kv_model import (
    HFCacheModel,
    KVBackend,
    LlamaKVModel,
    UnsupportedModelError,
    sliding_window_limit,
)
from looprl.engines.sampling import RowParams, sample
from looprl.types import FinishReason, Generation, SamplingParams

logger = logging.getLogger(__name__)

PREFILL_TOKEN_BUDGET = 8192  # padded prompt tokens per prefill forward (bounds activation memory)
Backend = Literal["auto", "kv", "hf"]


@dataclass
class EngineStats:
    """Counters since the engine started (read them for throughput metrics)."""

    requests: int = 0
    prompt_tokens: int = 0
    prefill_tokens_saved: int = 0  # prompt tokens not recomputed because an identical prompt was
    generated_tokens: int = 0
    decode_steps: int = 0
    busy_seconds: float = 0.0


@dataclass
class _Sequence:
    """One request inside the engine: its prompt, settings, sampled tokens and how to report back."""

    prompt: list[int]
    sampling: SamplingParams
    rng: random.Random
    on_done: Callable[[Generation], None]
    watcher: StopStringWatcher
    started: float = field(default_factory=time.perf_counter)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    cache_len: int = 0  # positions of this sequence held in the KV cache
    cancelled: bool = False

    @property
    def row(self) -> RowParams:
        """Sampling settings for `looprl.engines.sampling.sample`."""
        s = self.sampling
        return RowParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k)


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


def _check_request(prompt: list[int] | None, s: SamplingParams, vocab: int, max_len: int) -> str | None:
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


def _resolve_future(fut: asyncio.Future[Generation], gen: Generation) -> None:
    """Set an asyncio future's result unless its waiter has gone (cancelled)."""
    if not fut.done():
        fut.set_result(gen)


class TorchEngine:
    """Continuous-batching sampler for a Hugging Face causal LM (token level: ids in, ids + logprobs out).

    Args:
        model: the causal LM. Llama, Mistral, SmolLM2, Qwen2 and Qwen3 run on the fast path;
            anything else runs through the model's own forward and cache (slower, same results).
            The model is moved to `device` if it is elsewhere.
        tokenizer: used for `decode` (final text, stop strings) and default stop ids only.
        max_batch_size: most sequences decoded together (KV-cache slots).
        device: "cuda" when available, else "cpu", unless given.
        seed: engine seed; a request's random stream is seeded from (seed, request.sampling.seed),
            or from (seed, arrival number) when the request has no seed.
        stop_token_ids: tokens that end a turn (kept in the output). None = the tokenizer's eos,
            the model's generation-config eos ids and `<|im_end|>`; [] = never stop on a token.
        max_seq_len: context limit, prompt plus generated tokens (default: the model's
            `max_position_embeddings`, capped at its sliding window if it has one).
        backend: "kv" (fast path; raises if unsupported), "hf" (model's own forward) or "auto".
    """

    token_level = True

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        *,
        max_batch_size: int = 64,
        device: str | torch.device | None = None,
        seed: int = 0,
        stop_token_ids: list[int] | None = None,
        max_seq_len: int | None = None,
        backend: Backend = "auto",
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if next(model.parameters()).device != device:
            model.to(device)
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.device = device
        self.seed = seed
        self.stop_token_ids = (
            set(stop_token_ids) if stop_token_ids is not None else default_stop_ids(model, tokenizer)
        )
        self.max_seq_len = max_seq_len or self._default_max_len(model)
        self.vocab_size = int(model.get_input_embeddings().weight.shape[0])
        self.backend: KVBackend = self._make_backend(backend)
        self.stats = EngineStats()
        self.weights_lock = threading.Lock()  # held while a step runs or weights are synced
        self._cond = threading.Condition()
        self._waiting: deque[_Sequence] = deque()
        self._active: list[_Sequence] = []  # index i lives in KV slot i
        self._closed = False
        self._arrivals = 0
        self._thread = threading.Thread(target=self._loop, name="looprl-torch-engine", daemon=True)
        self._thread.start()

    @staticmethod
    def _default_max_len(model: nn.Module) -> int:
        cfg = model.config
        limit = int(getattr(cfg, "max_position_embeddings", None) or 2048)
        window = sliding_window_limit(cfg)
        return min(limit, window) if window else limit

    def _make_backend(self, backend: Backend) -> KVBackend:
        if backend not in ("auto", "kv", "hf"):
            raise ValueError(f"unknown backend {backend!r}; choose 'auto', 'kv' or 'hf'")
        if backend != "hf":
            try:
                return LlamaKVModel(
                    self.model, max_slots=self.max_batch_size, max_seq_len=self.max_seq_len
                )
            except UnsupportedModelError as exc:
                if backend == "kv":
                    raise
                logger.warning("TorchEngine: no fast path (%s); using the model's own forward", exc)
        return HFCacheModel(self.model)

    @property
    def backend_name(self) -> str:
        """'kv' for the fast path, 'hf' for the model's own forward."""
        return "kv" if isinstance(self.backend, LlamaKVModel) else "hf"

    # --- public API -------------------------------------------------------------------------
    async def generate(self, request: GenerationRequest) -> Generation:
        """Sample one continuation of `request.prompt_ids`; never raises for a bad request."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Generation] = loop.create_future()

        def on_done(gen: Generation) -> None:
            try:
                loop.call_soon_threadsafe(_resolve_future, fut, gen)
            except RuntimeError:  # the caller's loop has closed; nobody is waiting
                pass

        seq = self._submit(request.prompt_ids, request.sampling, on_done)
        try:
            return await fut
        except asyncio.CancelledError:
            if seq is not None:
                seq.cancelled = True  # the worker drops it at its next step
            raise

    def generate_many(
        self, prompts: list[list[int]], sampling: SamplingParams | list[SamplingParams]
    ) -> list[Generation]:
        """Blocking batch call (benchmarks, tests): all prompts are submitted at once."""
        params = sampling if isinstance(sampling, list) else [sampling] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} sampling params")
        futures: list[concurrent.futures.Future[Generation]] = []
        for prompt, p in zip(prompts, params, strict=True):
            fut: concurrent.futures.Future[Generation] = concurrent.futures.Future()
            futures.append(fut)
            self._submit(prompt, p, fut.set_result)
        return [f.result() for f in futures]

    def sync_weights(self, source: nn.Module | Mapping[str, torch.Tensor]) -> None:
        """Copy parameters from `source` (a model or state dict with the same names) into the engine's model.

        Waits for the current decoding step; later steps use the new weights.
        """
        state = source.state_dict() if isinstance(source, nn.Module) else source
        targets = dict(self.model.named_parameters())
        missing = [name for name in targets if name not in state]
        if missing:
            raise ValueError(
                f"sync_weights: source lacks {len(missing)} parameters (first: {missing[:3]}); pass "
                "the unwrapped model (not a DDP/compiled/PEFT wrapper) or merge adapters first"
            )
        with self.weights_lock, torch.no_grad():
            for name, param in targets.items():
                src = state[name]
                if src.shape != param.shape:
                    raise ValueError(f"sync_weights: {name} has shape {tuple(src.shape)}, expected {tuple(param.shape)}")
                param.copy_(src)

    def shutdown(self) -> None:
        """Stop the worker thread; pending requests finish with an error. Blocking."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

    async def close(self) -> None:
        """Stop the worker thread without blocking the event loop."""
        await asyncio.to_thread(self.shutdown)

    # --- submission -------------------------------------------------------------------------
    def _submit(
        self, prompt: list[int] | None, sampling: SamplingParams, on_done: Callable[[Generation], None]
    ) -> _Sequence | None:
        """Queue one request, or answer it at once with an error Generation if it cannot run."""
        problem = _check_request(prompt, sampling, self.vocab_size, self.max_seq_len)
        if problem is None and self._closed:
            problem = "the engine is closed; create a new TorchEngine"
        if problem is not None or prompt is None:
            on_done(Generation(text="", finish_reason="error", error=problem))
            return None
        with self._cond:
            arrival = self._arrivals
            self._arrivals += 1
            key = sampling.seed if sampling.seed is not None else f"arrival-{arrival}"
            seq = _Sequence(
                prompt=list(prompt),
                sampling=sampling,
                rng=random.Random(f"{self.seed}:{key}"),
                on_done=on_done,
                watcher=StopStringWatcher(self.tokenizer, sampling.stop),
            )
            self._waiting.append(seq)
            self._cond.notify()
        return seq

    # --- worker -----------------------------------------------------------------------------
    def _next_admissions(self) -> list[_Sequence] | None:
        """Block until there is work; return the waiting requests that fit (None when closing)."""
        with self._cond:
            while not self._closed and not self._waiting and not self._active:
                self._cond.wait()
            if self._closed:
                return None
            free = self.max_batch_size - len(self._active)
            taken = [self._waiting.popleft() for _ in range(min(free, len(self._waiting)))]
        return [s for s in taken if not s.cancelled]

    def _loop(self) -> None:
        """Worker thread: admit, prefill, decode, repeat; a failing step fails its sequences only."""
        with torch.inference_mode():
            while (admitted := self._next_admissions()) is not None:
                start = time.perf_counter()
                with self.weights_lock:
                    self._drop_cancelled()
                    if admitted:
                        try:
                            self._admit(admitted)
                        except Exception as exc:  # e.g. out of memory: fail these requests only
                            logger.exception("TorchEngine: prefill failed")
                            self._fail(admitted, f"prefill failed: {exc!r}", remove=True)
                    if self._active:
                        try:
                            self._decode_step()
                        except Exception as exc:
                            logger.exception("TorchEngine: decoding step failed")
                            self._fail(list(self._active), f"decoding failed: {exc!r}", remove=True)
                self.stats.busy_seconds += time.perf_counter() - start
        with self._cond:
            leftover = list(self._waiting) + self._active
            self._waiting.clear()
        self._active = []
        self._fail(leftover, "the engine was closed before this request finished", remove=False)

    def _admit(self, seqs: list[_Sequence]) -> None:
        """Prefill new sequences into the slots after the active ones and sample their first tokens."""
        seqs = sorted(seqs, key=lambda s: len(s.prompt))
        while seqs:
            width = len(seqs[0].prompt)
            take = 0
            while take < len(seqs) and len(seqs[take].prompt) * (take + 1) <= max(
                PREFILL_TOKEN_BUDGET, width
            ):
                take += 1
            self._prefill_group(seqs[:take])
            seqs = seqs[take:]

    def _prefill_group(self, seqs: list[_Sequence]) -> None:
        """Prefill one group; identical prompts are computed once and their cache rows copied."""
        first = len(self._active)
        originals: list[_Sequence] = []
        copies: list[tuple[_Sequence, int]] = []  # (sequence, row of its original in the batch)
        row_of: dict[tuple[int, ...], int] = {}
        for s in seqs:
            key = tuple(s.prompt)
            if key in row_of:
                copies.append((s, row_of[key]))
            else:
                row_of[key] = len(originals)
                originals.append(s)
        self.backend.reserve(first + len(seqs), max(len(s.prompt) for s in originals))
        logits = self.backend.prefill([s.prompt for s in originals], first)  # (originals, V)
        for j, (s, row) in enumerate(copies):
            self.backend.move_slot(first + row, first + len(originals) + j, len(s.prompt))
        placed = originals + [s for s, _ in copies]
        for s in placed:
            s.cache_len = len(s.prompt)
            self.stats.requests += 1
            self.stats.prompt_tokens += len(s.prompt)
        self.stats.prefill_tokens_saved += sum(len(s.prompt) for s, _ in copies)
        self._active.extend(placed)
        rows = list(range(len(originals))) + [row for _, row in copies]
        self._sample_into(first, logits[rows])

    def _decode_step(self) -> None:
        """Feed each active sequence its last sampled token and sample the next one."""
        active = self._active
        self.backend.reserve(len(active), max(s.cache_len for s in active) + 1)
        tokens = torch.tensor([s.tokens[-1] for s in active], dtype=torch.long)
        positions = torch.tensor([s.cache_len for s in active], dtype=torch.long)
        logits = self.backend.decode(tokens, positions)  # (n, V)
        for s in active:
            s.cache_len += 1
        self.stats.decode_steps += 1
        self._sample_into(0, logits)

    def _sample_into(self, first: int, logits: torch.Tensor) -> None:
        """Sample for slots `first..first+len(logits)-1`, append, and retire finished sequences."""
        seqs = self._active[first : first + logits.shape[0]]
        uniforms = [s.rng.random() for s in seqs]
        tokens, logprobs = sample(logits, [s.row for s in seqs], uniforms)
        finished: list[tuple[int, FinishReason]] = []
        for offset, (s, tok, lp) in enumerate(zip(seqs, tokens, logprobs, strict=True)):
            s.tokens.append(tok)
            s.logprobs.append(lp)
            self.stats.generated_tokens += 1
            reason = self._finish_reason(s)
            if reason is not None:
                finished.append((first + offset, reason))
        for slot, reason in sorted(finished, reverse=True):
            self._retire(slot, reason)

    def _finish_reason(self, s: _Sequence) -> FinishReason | None:
        """'stop' on a stop token or string, 'length' at max_tokens or the context limit, else None."""
        if s.tokens[-1] in self.stop_token_ids or s.watcher.add(s.tokens):
            return "stop"
        if len(s.tokens) >= s.sampling.max_tokens or len(s.prompt) + len(s.tokens) >= self.max_seq_len:
            return "length"
        return None

    def _retire(self, slot: int, reason: FinishReason) -> None:
        """Answer the sequence in `slot` and move the last active sequence into its slot."""
        seq = self._active[slot]
        last = len(self._active) - 1
        if slot != last:
            moved = self._active[last]
            self.backend.move_slot(last, slot, moved.cache_len)
            self._active[slot] = moved
        self._active.pop()
        self.backend.truncate(len(self._active))
        if seq.cancelled:
            return
        try:
            text = self.tokenizer.decode(seq.tokens, skip_special_tokens=False)
            gen = Generation(text=text, token_ids=seq.tokens, logprobs=seq.logprobs, finish_reason=reason)
        except Exception as exc:  # a tokenizer bug must not take the batch down
            gen = Generation(text="", finish_reason="error", error=f"decoding the text failed: {exc!r}")
        gen.seconds = time.perf_counter() - seq.started
        seq.on_done(gen)

    def _drop_cancelled(self) -> None:
        """Free the slots of sequences whose callers stopped waiting."""
        for slot in range(len(self._active) - 1, -1, -1):
            if self._active[slot].cancelled:
                self._retire(slot, "error")

    def _fail(self, seqs: list[_Sequence], message: str, *, remove: bool) -> None:
        """Answer `seqs` with an error Generation (and drop them from the active slots)."""
        if remove:
            ids = {id(s) for s in seqs}
            self._active = [s for s in self._active if id(s) not in ids]
            self.backend.truncate(len(self._active))
        for s in seqs:
            if not s.cancelled:
                gen = Generation(text="", finish_reason="error", error=message)
                gen.seconds = time.perf_counter() - s.started
                s.on_done(gen)

