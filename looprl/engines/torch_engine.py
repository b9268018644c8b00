"""In-process torch engine: continuous batching over a slot-based KV cache, on CPU or one GPU.

Many rollout coroutines call `TorchEngine.generate` at once. A background worker thread owns the
model loop: each iteration it admits waiting requests into free slots (prefilling them together,
and computing identical prompts only once), then decodes every active sequence by one token. A
sequence that finishes frees its slot, which the next iteration refills. Results go back to the
caller's event loop with `call_soon_threadsafe`, so the event loop never runs the model.

Weights, two modes:

- shared (default): give the engine the trainer's own model; an optimizer step is seen on the
  next step (with `fuse_projections`, the fused q/k/v and gate/up copies are rebuilt when a weight's
  version counter moves; after an update through `.data` call `sync_weights(None)`). Update
  weights only while nothing is generating, or hold `engine.weights_lock` meanwhile.
- separate copy (asynchronous training): give the engine its own copy of the model and call
  `engine.sync_weights(trainer_model)` when the trainer has finished a step; the copy waits for
  the current decoding step, then overwrites the engine's parameters in place.

In-flight updates (`in_flight_updates = True`): `sync_weights` may be called while requests
decode. The worker starts no further step once a sync is waiting, so the swap lands between two
steps; running sequences keep their keys/values (computed by the old weights) and sample their
next tokens with the new ones, as PipelineRL's in-flight updates do. Each token records the
version that sampled it (`Generation.versions`); the prefix cache is emptied and a sequence that
spans a swap is not cached when it finishes.

Multi-turn rollouts: when a sequence finishes, its keys/values go into a prefix cache
(`looprl.engines.prefix_cache`); a later prompt that extends it (the same conversation plus the
environment's reply) prefills only the new tokens. The cache is emptied whenever the weights
change (`sync_weights`, or an in-place update detected by a weight fingerprint at admission), so
no turn ever continues keys/values computed by older weights. New prompts admitted together that
start alike (the system prompt and tool schemas every task of an environment shares) prefill
that common prefix once (`prefix_cache.shared_prefix_len`) and each computes only its own rest.

Memory: a request is admitted only while the KV cache that every admitted sequence could grow to
fits `kv_cache_mb` (default: a quarter of the device's memory); the others wait in arrival order
(`looprl.engines.admission`).

Sampling and logprobs follow `looprl.engines.sampling`: logprobs are `log_softmax(logits / T)` at
the sampled token, before top-p/top-k truncation (temperature 1 for greedy requests). The worker
runs each step on `threads` torch threads when set (`looprl.engines.threads`; by default the
process's count).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from looprl.engines.admission import Admission, kv_budget_bytes
from looprl.engines.backends import Backend, default_max_len, make_backend
from looprl.engines.base import GenerationRequest
from looprl.engines.detokenize import StopStringWatcher
from looprl.engines.kv_model import KVBackend, LlamaKVModel
from looprl.engines.prefix_cache import PrefixCache, PrefixEntry, shared_prefix_len
from looprl.engines.sampling import sample
from looprl.engines.sequence import EngineStats, SequenceState, check_request, default_stop_ids
from looprl.engines.threads import torch_threads
from looprl.models.weights import copy_weights
from looprl.types import FinishReason, Generation, SamplingParams

logger = logging.getLogger(__name__)

PREFILL_TOKEN_BUDGET = 8192  # padded prompt tokens per prefill forward (bounds activation memory)


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
        prefix_cache_mb: memory for finished turns' keys/values, so that the next turn of a
            conversation (same tokens plus a suffix) prefills only the suffix. 0 turns it off;
            the fast path only. Entries are dropped whenever the weights change.
        fuse_projections: on the fast path, run q/k/v and gate/up as one matmul each over fused
            weight copies (about 2/3 of the layer weights, kept current). Off by default: on CPU it
            measured no faster than separate matmuls.
        pack_weights: on the fast path, run the matmuls over MKL-packed weight copies (CPU,
            float32; `looprl.engines.weight_copies`): faster decode for 2-3x the weights' memory.
        threads: torch threads for each prefill and decoding step, on the worker thread only
            (None, the default: the process's count; 1 never stalls under load but leaves a quiet
            machine's second core idle, and while training runs beside the engine it changes
            the count the update's matmuls see: docs/benchmarks.md "Decode on CPU").
        kv_cache_mb: the KV cache's memory budget (module doc); None: a quarter of the device's.
    """

    token_level = True
    in_flight_updates = True  # sync_weights may run while requests decode (module doc)

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
        prefix_cache_mb: int = 1024,
        fuse_projections: bool = False,
        pack_weights: bool = True,
        threads: int | None = None,
        kv_cache_mb: int | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if next(model.parameters()).device != device:
            model.to(device)
        self.model: Any = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.device = device
        self.seed = seed
        self.threads = threads
        self.stop_token_ids = (
            set(stop_token_ids)
            if stop_token_ids is not None
            else default_stop_ids(model, tokenizer)
        )
        self.max_seq_len = max_seq_len or default_max_len(model)
        hf_model: Any = model  # nn.Module attributes are untyped for mypy
        self.vocab_size = int(hf_model.get_input_embeddings().weight.shape[0])
        self.backend: KVBackend = make_backend(
            model, backend, max_slots=max_batch_size, max_seq_len=self.max_seq_len,
            fuse=fuse_projections, pack=pack_weights,
        )  # fmt: skip
        self.stats = EngineStats()
        self.backend.max_bytes = budget = kv_budget_bytes(kv_cache_mb, device)
        self.admission = Admission(self.backend, budget, self.max_seq_len, self.stats)
        self.policy_version = 0  # the optimizer step whose weights are sampled (TrainableEngine)
        self.weights_lock = threading.Lock()  # held while a step runs or weights are synced
        self._cond = threading.Condition()
        self._waiting: deque[SequenceState] = deque()
        self._active: list[SequenceState] = []  # index i lives in KV slot i
        self._closed = False
        self._arrivals = 0
        self._epoch = 0  # bumped whenever the weights change
        self._syncs_waiting = 0  # sync_weights calls waiting for the step to end (under _cond)
        use_prefix = prefix_cache_mb > 0 and self.backend.supports_prefix
        self._prefix = PrefixCache(prefix_cache_mb * 2**20) if use_prefix else None
        self._thread = threading.Thread(target=self._loop, name="looprl-torch-engine", daemon=True)
        self._thread.start()

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
            with contextlib.suppress(RuntimeError):  # the caller's loop closed: nobody waits
                loop.call_soon_threadsafe(_resolve_future, fut, gen)

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

    def sync_weights(
        self,
        source: nn.Module | Mapping[str, torch.Tensor] | None,
        *,
        version: int | None = None,
    ) -> None:
        """Copy parameters from `source` (a model or state dict with the same names) into the engine's model.

        Waits for the current decoding step (requests in flight go on with the new weights, see
        the module doc); later steps use the new weights and record `version` on the tokens they
        sample. `source=None` means the engine samples from the trainer's own tensors, already
        updated in place (the prefix cache notices by fingerprint): `policy_version` moves and the
        fast path rebuilds its fused q/k/v and gate/up weights before the next step. `version`
        defaults to the current version plus one.
        """
        state = source.state_dict() if isinstance(source, nn.Module) else source
        with self._cond:
            self._syncs_waiting += 1  # the worker starts no new step meanwhile
        try:
            with self.weights_lock:
                if state is not None:
                    copy_weights(self.model, state)  # checks every name and shape first
                    self._epoch += 1
                    if self._prefix is not None:
                        self._prefix.clear()
                self.backend.weights_changed()  # updates that bypass autograd's version counter
                self.policy_version = self.policy_version + 1 if version is None else version
        finally:
            with self._cond:
                self._syncs_waiting -= 1
                self._cond.notify_all()

    def release_memory(self) -> bool:
        """Free the KV cache if nothing is generating (e.g. during a training step); True if freed."""
        with self.weights_lock:
            if self._active:
                return False
            self.backend.release()
            if self._prefix is not None:
                self._prefix.clear()
            return True

    def shutdown(self) -> None:
        """Stop the worker (pending requests get an error) and free the caches. Blocking."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        self.release_memory()  # nothing is active once the worker has ended

    async def close(self) -> None:
        """Stop the worker thread without blocking the event loop."""
        await asyncio.to_thread(self.shutdown)

    # --- submission -------------------------------------------------------------------------
    def _submit(
        self,
        prompt: list[int] | None,
        sampling: SamplingParams,
        on_done: Callable[[Generation], None],
    ) -> SequenceState | None:
        """Queue one request, or answer it at once with an error Generation if it cannot run."""
        problem = check_request(prompt, sampling, self.vocab_size, self.max_seq_len)
        if problem is None and self._closed:
            problem = "the engine is closed; create a new TorchEngine"
        if problem is not None or prompt is None:
            on_done(Generation(text="", finish_reason="error", error=problem))
            return None
        with self._cond:
            arrival = self._arrivals
            self._arrivals += 1
            key = sampling.seed if sampling.seed is not None else f"arrival-{arrival}"
            seq = SequenceState(
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
    def _next_admissions(self) -> list[SequenceState] | None:
        """Block until there is work; return the waiting requests that fit (None when closing)."""
        with self._cond:
            while not self._closed and (self._syncs_waiting or not (self._waiting or self._active)):
                self._cond.wait()
            if self._closed:
                return None
            return self.admission.take(self._waiting, self._active, self.max_batch_size)

    def _loop(self) -> None:
        """Worker thread: admit, prefill, decode, repeat; a failing step fails its sequences only."""
        with torch.inference_mode():
            while (admitted := self._next_admissions()) is not None:
                start = time.perf_counter()
                with self.weights_lock, torch_threads(self.threads):
                    self._step(admitted)
                self.stats.busy_seconds += time.perf_counter() - start
        with self._cond:
            leftover = list(self._waiting) + self._active
            self._waiting.clear()
        self._active = []
        self._fail(leftover, "the engine was closed before this request finished")

    def _step(self, admitted: list[SequenceState]) -> None:
        """One scheduler iteration: free cancelled slots, prefill newcomers, decode everyone."""
        if admitted:
            try:
                self._drop_cancelled()
                self._admit(admitted)
            except Exception as exc:  # e.g. out of memory: fail the newcomers only
                logger.exception("TorchEngine: prefill failed")
                self._fail(admitted, f"prefill failed: {exc!r}")
        if self._active:
            try:
                self._drop_cancelled()
                if self._active:  # all of them may have been cancelled
                    self._decode_step()
            except Exception as exc:
                logger.exception("TorchEngine: decoding step failed")
                self._fail(list(self._active), f"decoding failed: {exc!r}")

    def _admit(self, seqs: list[SequenceState]) -> None:
        """Prefill new sequences into the slots after the active ones and sample their first tokens.

        Identical prompts (a GRPO group) are computed once; a prompt that continues a finished
        turn reuses its cached keys/values; the prefix that the other new prompts share (a system
        prompt with tool schemas) is computed once. Shortest work first, in forwards of at most
        PREFILL_TOKEN_BUDGET padded tokens (one longer prompt still goes alone).
        """
        if self._prefix is not None and self._prefix.check_weights(self.model):
            self._epoch += 1
        by_prompt: dict[tuple[int, ...], list[SequenceState]] = {}
        for s in seqs:
            s.epoch = self._epoch
            by_prompt.setdefault(tuple(s.prompt), []).append(s)
        groups = list(by_prompt.values())
        if self._prefix is not None and self._prefix.entries:
            for g in groups:
                g[0].prefix = self._prefix.take(g[0].prompt)
        self._prefill_shared([g[0] for g in groups if g[0].prefix is None])

        def work(g: list[SequenceState]) -> int:
            return len(g[0].prompt) - (g[0].prefix[0] if g[0].prefix else 0)

        groups.sort(key=work)
        while groups:
            budget = max(PREFILL_TOKEN_BUDGET, work(groups[0]))
            take = 1
            while take < len(groups) and work(groups[take]) * (take + 1) <= budget:
                take += 1
            self._prefill(groups[:take])
            groups = groups[take:]

    def _prefill_shared(self, fresh: list[SequenceState]) -> None:
        """Prefill once the prefix that `fresh` prompts (nothing cached) share; each then reuses it."""
        n = shared_prefix_len([s.prompt for s in fresh]) if self.backend.supports_prefix else 0
        if not n:
            return
        slot = len(self._active)  # free until the groups are placed
        self.backend.reserve(slot + 1, max(n, self._live_len()))
        self.backend.prefill([fresh[0].prompt[:n]], slot)
        keys, values = self.backend.export_slot(slot, n)
        entry = PrefixEntry(tokens=fresh[0].prompt[:n], keys=keys, values=values)
        for s in fresh:
            s.prefix = (n, entry)
        self.stats.shared_prefills += 1

    def _prefill(self, groups: list[list[SequenceState]]) -> None:
        """Prefill one prompt per group; the rest of each group copies its original's cache."""
        first = len(self._active)
        originals = [g[0] for g in groups]
        copies = [(s, row) for row, g in enumerate(groups) for s in g[1:]]
        longest = max(len(s.prompt) for s in originals)
        self.backend.reserve(first + len(originals) + len(copies), max(longest, self._live_len()))
        starts = []
        for row, s in enumerate(originals):
            reused = 0
            if s.prefix is not None:
                reused, entry = s.prefix
                self.backend.import_slot(first + row, entry.keys, entry.values, reused)
                s.prefix = None
                self.stats.prefix_hits += 1
            starts.append(reused)
        logits = self.backend.prefill([s.prompt for s in originals], first, starts)  # (orig, V)
        for j, (s, row) in enumerate(copies):
            self.backend.copy_slot(first + row, first + len(originals) + j, len(s.prompt))
        placed = originals + [s for s, _ in copies]
        for s in placed:
            s.cache_len = len(s.prompt)
            self.stats.requests += 1
            self.stats.prompt_tokens += len(s.prompt)
        saved = sum(starts) + sum(len(s.prompt) for s, _ in copies)
        self.stats.prefill_tokens_saved += saved
        self._active.extend(placed)
        rows = list(range(len(originals))) + [row for _, row in copies]
        self._sample_into(first, logits[rows])

    def _live_len(self) -> int:
        """The positions the active sequences hold (a resize must keep them)."""
        return max((s.cache_len for s in self._active), default=0)

    def _decode_step(self) -> None:
        """Feed each active sequence its last sampled token and sample the next one."""
        active = self._active
        self.backend.reserve(len(active), self._live_len() + 1)
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
            s.versions.append(self.policy_version)  # set with the weights, under weights_lock
            self.stats.generated_tokens += 1
            reason = self._finish_reason(s)
            if reason is not None:
                finished.append((first + offset, reason))
        for slot, reason in sorted(finished, reverse=True):
            self._retire(slot, reason)

    def _finish_reason(self, s: SequenceState) -> FinishReason | None:
        """'stop' on a stop token or string, 'length' at max_tokens or the context limit, else None."""
        if s.tokens[-1] in self.stop_token_ids or s.watcher.add(s.tokens):
            return "stop"
        if (
            len(s.tokens) >= s.sampling.max_tokens
            or len(s.prompt) + len(s.tokens) >= self.max_seq_len
        ):
            return "length"
        return None

    def _retire(self, slot: int, reason: FinishReason) -> None:
        """Answer the sequence in `slot` and move the last active sequence into its slot."""
        seq = self._active[slot]
        if self._prefix is not None and not seq.cancelled and seq.epoch == self._epoch:
            keys, values = self.backend.export_slot(slot, seq.cache_len)
            tokens = (seq.prompt + seq.tokens)[: seq.cache_len]
            self._prefix.put(PrefixEntry(tokens=tokens, keys=keys, values=values))
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
        except Exception as exc:  # a tokenizer bug must not take the batch down
            error = f"decoding the text failed: {exc!r}"
            seq.answer(Generation(text="", finish_reason="error", error=error))
            return
        seq.answer(Generation(
            text=text, token_ids=seq.tokens, logprobs=seq.logprobs, finish_reason=reason,
            versions=seq.versions,
        ))  # fmt: skip

    def _drop_cancelled(self) -> None:
        """Free the slots of sequences whose callers stopped waiting."""
        for slot in range(len(self._active) - 1, -1, -1):
            if self._active[slot].cancelled:
                self._retire(slot, "error")

    def _fail(self, seqs: list[SequenceState], message: str) -> None:
        """Answer `seqs` with an error Generation and drop any of them from the active slots.

        Failed sequences are always the newest admitted or all active ones, so the survivors keep
        slots `0..n-1`.
        """
        failed = {id(s) for s in seqs}
        self._active = [s for s in self._active if id(s) not in failed]
        self.backend.truncate(len(self._active))
        for s in seqs:
            s.answer(Generation(text="", finish_reason="error", error=message))
