"""Batched forward passes with a slot-based KV cache: a fast path for Llama-family models, HF fallback.

Two backends share one small interface (`KVBackend`: reserve, prefill, decode, move/copy a slot):

- `LlamaKVModel` runs its own forward for Llama, Mistral, SmolLM2, Qwen2 (qkv bias) and Qwen3 (q/k
  norm). It reads every weight from the Hugging Face module at each call, never copying it, so a
  trainer's in-place update (or `load_state_dict(assign=True)`) is seen on the next step. Keys and
  values live in one tensor per kind, `(layers, slots, kv_heads, capacity, head_dim)`, grown by
  doubling. With `fuse=True` (off by default: on 2 CPU cores no faster than 7 separate matmuls,
  docs/benchmarks.md "Decode on CPU") q/k/v and gate/up run as one matmul each over fused copies
  (about 2/3 of the layer weights); with `pack=True` every matmul runs over MKL-packed copies
  (`looprl.engines.weight_copies`: 1.3-2x faster at decode's few rows), rebuilt before a forward when a source
  weight is another tensor or its autograd version counter moved, and after `weights_changed()`
  (the engine calls it in `sync_weights`; needed after `param.data.add_` or `AdamW(fused=True)`,
  which bypass the counter). Logprobs equal the unfused path's within 1e-5 (tests).
- `HFCacheModel` calls the model's own forward with its own cache, one sequence at a time. It is
  slower but works for any causal LM and is used when `LlamaKVModel` does not support a model.

Active sequences always occupy slots `0..n-1` (the engine moves the last sequence into a freed slot),
so decoding reads plain views of the cache and never gathers.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from looprl.engines.weight_copies import HeadCopy, LayerCopies, mkl_packing_works, worth_packing

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


class UnsupportedModelError(ValueError):
    """Raised when `LlamaKVModel` cannot run a model exactly; the engine then falls back to HF."""


class KVBackend(Protocol):
    """What the engine needs from a backend. Slot i holds the KV cache of the i-th active sequence."""

    def reserve(self, slots: int, length: int) -> None:
        """Make room for `slots` sequences of up to `length` cached tokens; the caller passes
        sizes that cover every live slot and position (the backend may resize to them)."""
        ...

    def cache_bytes(self, slots: int, length: int) -> int:
        """The most bytes the cache holds for `slots` sequences of up to `length` positions (as
        `reserve` sizes it within `max_bytes`)."""
        ...

    supports_prefix: bool  # whether export_slot / import_slot and prefill `starts` work
    max_bytes: int | None  # the cache's memory budget (`reserve` stays within it when it can)

    def prefill(
        self, prompts: list[list[int]], first_slot: int, starts: list[int] | None = None
    ) -> torch.Tensor:
        """Cache `prompts` into slots `first_slot...`; return next-token logits `(len(prompts), V)`.

        `starts[i]` positions of prompt i are already in its slot (see `import_slot`).
        """
        ...

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Feed one token per slot `0..n-1` at `positions`; return next-token logits `(n, V)`."""
        ...

    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Move slot `src` (positions `0..length-1`) into slot `dst`; `src` is freed."""
        ...

    def copy_slot(self, src: int, dst: int, length: int) -> None:
        """Copy slot `src` (positions `0..length-1`) into slot `dst`; both stay in use."""
        ...

    def truncate(self, slots: int) -> None:
        """Forget slots `slots...` (their sequences are finished)."""
        ...

    def weights_changed(self) -> None:
        """Drop anything computed from the weights (fused or packed copies); called after a weight sync."""
        ...

    def release(self) -> None:
        """Free all cache memory (only called when no sequence is active)."""
        ...

    def export_slot(self, slot: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of a slot's keys and values for positions `0..length-1`: (layers, Hkv, L, D)."""
        ...

    def import_slot(self, slot: int, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        """Load the first `length` positions of exported keys/values into `slot`."""
        ...


def _next_size(need: int, current: int, minimum: int, limit: int) -> int:
    """Smallest power-of-two multiple of `minimum` that is >= `need` (capped at `limit`)."""
    size = max(current, minimum)
    while size < need:
        size *= 2
    return min(size, limit)


def _round_up(need: int, step: int, limit: int) -> int:
    """`need` rounded up to a multiple of `step` (capped at `limit`)."""
    return min(-(-need // step) * step, limit)


def _rms_norm(x: torch.Tensor, norm: Any) -> torch.Tensor:
    """RMSNorm as HF Llama/Qwen compute it (in float32, weight applied in the input dtype)."""
    if x.dtype == torch.float32 and norm.weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)  # one fused kernel
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * h.to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """HF's `x * cos + rotate_half(x) * sin`, with rotate_half's sign folded into `signed_sin`.

    rotate_half(x) = cat(-x2, x1) = roll(x, D/2) * [-1 (first half), +1 (second half)].
    """
    return torch.addcmul(x * cos, torch.roll(x, x.shape[-1] // 2, dims=-1), signed_sin)


def _linear(x: torch.Tensor, proj: Any) -> torch.Tensor:
    """Apply an `nn.Linear` through its current weight and bias (no copy)."""
    return F.linear(x, proj.weight, proj.bias)


def _check_supported(model: Any) -> None:
    """Raise UnsupportedModelError unless the model has the Llama-family layout we implement."""
    cfg = model.config
    if cfg.model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"model_type {cfg.model_type!r} has no fast path; supported: {SUPPORTED_MODEL_TYPES}"
        )
    inner = getattr(model, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if inner is None or not all(hasattr(inner, n) for n in needed) or not hasattr(model, "lm_head"):
        raise UnsupportedModelError(
            "model lacks model.{embed_tokens,layers,norm,rotary_emb}/lm_head"
        )
    rope_type = getattr(inner.rotary_emb, "rope_type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"RoPE type {rope_type!r} depends on the sequence length and is not supported by the "
            f"fast path (supported: {SUPPORTED_ROPE_TYPES}); use backend='hf' for this model"
        )
    act = getattr(cfg, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise UnsupportedModelError(f"hidden_act {act!r} is not SwiGLU; use backend='hf'")
    projections = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    for layer in inner.layers:
        for name in projections:
            module = getattr(layer.self_attn, name, None) or getattr(layer.mlp, name, None)
            if type(module) is not nn.Linear:  # LoRA, quantised or otherwise wrapped layers
                raise UnsupportedModelError(
                    f"{name} is a {type(module).__name__}, not a plain nn.Linear (LoRA adapters or "
                    "quantisation?); the model's own forward will be used"
                )


def sliding_window_limit(config: Any) -> int | None:
    """The sliding-attention window if any layer uses one, else None (full attention everywhere)."""
    window = getattr(config, "sliding_window", None)
    if window is None:
        return None
    layer_types = getattr(config, "layer_types", None)
    if config.model_type == "mistral" or (layer_types and "sliding_attention" in layer_types):
        return int(window)
    return None


class _PrefillPlan:
    """Index tensors shared by every layer of one prefill batch (`mask` None: fresh prompts)."""

    def __init__(self, first_slot: int, m: int, width: int) -> None:
        self.first_slot, self.m, self.width = first_slot, m, width
        self.mask: torch.Tensor | None = None  # (m, 1, T, span): may query t see key position j
        self.valid = torch.empty(0, dtype=torch.bool)  # (m, T): real tokens, not padding
        self.rows = torch.empty(0, dtype=torch.long)  # cache rows of the real tokens' keys
        self.rope: tuple[torch.Tensor, torch.Tensor] = (self.valid, self.valid)
        self.span = 0

    def offsets(self, model: LlamaKVModel, starts: torch.Tensor, lens: torch.Tensor) -> None:
        """Prepare for prompts whose first `starts[i]` positions are cached: rope, writes, mask."""
        device = starts.device
        t = torch.arange(self.width, device=device)
        pos = starts[:, None] + t  # (m, T) absolute position of each suffix token
        self.valid = t[None, :] < lens[:, None]  # (m, T) real tokens, not padding
        safe = torch.where(self.valid, pos, 0)
        self.rope = (
            model.cos[safe][:, :, None],
            model.signed_sin[safe][:, :, None],
        )  # (m, T, 1, D)
        row, col = self.valid.nonzero(as_tuple=True)  # (N,) each
        heads = torch.arange(model.num_kv_heads, device=device)
        slot_heads = (self.first_slot + row)[:, None] * model.num_kv_heads + heads  # (N, Hkv)
        self.rows = (slot_heads * model.k[0].shape[2] + pos[row, col][:, None]).reshape(-1)
        self.span = int((starts + lens).max())
        keys = torch.arange(self.span, device=device)
        self.mask = (keys[None, None, :] <= pos[:, :, None])[:, None]  # (m, 1, T, L)


class LlamaKVModel:
    """Fast batched forward for Llama-family models over a slot-based preallocated KV cache.

    `max_slots` bounds the number of concurrent sequences and `max_seq_len` the cached positions per
    sequence. Memory is allocated lazily and grown by doubling, so large limits cost nothing upfront;
    `max_bytes` (set by the engine) caps it (`reserve`).
    Sliding-window models are supported up to their window (within it, attention is full).
    `fuse` runs q/k/v and gate/up as one matmul each over fused weight copies; `pack` runs every
    matmul over MKL-packed copies (float32 on CPU with MKL; ignored elsewhere). Module doc.
    """

    def __init__(
        self,
        model: Any,
        *,
        max_slots: int,
        max_seq_len: int,
        fuse: bool = False,
        pack: bool = False,
    ) -> None:
        _check_supported(model)
        cfg = model.config
        self.model = model
        self.layers = list(model.model.layers)
        attn = self.layers[0].self_attn
        self.num_heads = int(cfg.num_attention_heads)
        self.num_kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.num_heads)
        self.head_dim = int(attn.head_dim)
        self.scale = float(attn.scaling)
        self.qk_norm = hasattr(attn, "q_norm") and hasattr(attn, "k_norm")
        self.max_slots = max_slots
        self.max_seq_len = max_seq_len
        weight = model.lm_head.weight
        self.device: torch.device = weight.device
        self.dtype: torch.dtype = weight.dtype
        self.pack = pack and weight.device.type == "cpu" and weight.dtype == torch.float32
        self.pack = self.pack and worth_packing(model) and mkl_packing_works()
        copies = fuse or self.pack
        self.copies = (
            [LayerCopies(x, fuse=fuse, pack=self.pack) for x in self.layers] if copies else None
        )
        self.head = HeadCopy(model.lm_head) if self.pack else None
        self.position_bytes = 2 * len(self.layers) * self.num_kv_heads * self.head_dim
        self.position_bytes *= self.dtype.itemsize  # keys and values of one position, all layers
        self.max_bytes: int | None = None
        self.release_cache()  # per layer: keys and values (slots, Hkv, length, D), empty
        self.cos = torch.empty(0, self.head_dim, dtype=self.dtype, device=self.device)
        self.signed_sin = torch.empty_like(self.cos)
        self.supports_prefix = True
        self._build_rope(1)  # fails early on partial rotary embeddings

    # --- cache management -------------------------------------------------------------------
    def _fitted(self, slots: int, length: int) -> tuple[int, int]:
        """Sizes made for `slots` x `length` alone: slots to a multiple of 4, positions of 256."""
        return _round_up(slots, 4, self.max_slots), _round_up(length, 256, self.max_seq_len)

    def cache_bytes(self, slots: int, length: int) -> int:
        """Bytes of a cache made for `slots` x `length` alone (`_fitted`): what `reserve` holds
        at most for them when doubling would pass `max_bytes`."""
        fitted_slots, fitted_len = self._fitted(slots, length)
        return self.position_bytes * fitted_slots * fitted_len

    def reserve(self, slots: int, length: int) -> None:
        """Resize the cache (keeping what it holds) to fit `slots` x `length`, which cover every
        live slot and position. It grows by doubling each size from what it has; when that
        would pass `max_bytes`, it is sized for `slots` x `length` alone (`cache_bytes`), which
        may shrink the other size. One layer is copied at a time, so resizing holds one layer's
        old and new tensors together, not the whole cache twice."""
        if slots > self.max_slots or length > self.max_seq_len:
            raise ValueError(
                f"cache request {slots}x{length} exceeds {self.max_slots}x{self.max_seq_len}"
            )
        cur_slots, cur_len = self._allocated
        if slots <= cur_slots and length <= cur_len:
            return
        new_slots = _next_size(slots, cur_slots, 4, self.max_slots)
        new_len = _next_size(length, cur_len, 256, self.max_seq_len)
        if (
            self.max_bytes is not None
            and self.position_bytes * new_slots * new_len > self.max_bytes
        ):
            new_slots, new_len = self._fitted(slots, length)
        keep_slots, keep_len = min(cur_slots, new_slots), min(cur_len, new_len)
        shape = (new_slots, self.num_kv_heads, new_len, self.head_dim)
        for cache in (self.k, self.v):
            for i, old in enumerate(cache):
                new = torch.zeros(shape, dtype=self.dtype, device=self.device)  # never NaN
                new[:keep_slots, :, :keep_len] = old[:keep_slots, :, :keep_len]
                cache[i] = new  # the old layer goes before the next one is allocated
        if new_len > self.cos.shape[0]:
            self._build_rope(new_len)

    @property
    def _allocated(self) -> tuple[int, int]:
        """The (slots, positions) the cache holds now."""
        return self.k[0].shape[0], self.k[0].shape[2]

    @property
    def allocated_bytes(self) -> int:
        """Bytes the cache holds now."""
        return self.position_bytes * self._allocated[0] * self._allocated[1]

    def release_cache(self) -> None:
        """Drop the cache tensors (the weight copies stay); the next `reserve` allocates again."""
        shape = (0, self.num_kv_heads, 0, self.head_dim)
        empty = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.k: list[torch.Tensor] = [empty] * len(self.layers)  # replaced, never written
        self.v: list[torch.Tensor] = [empty] * len(self.layers)

    def _build_rope(self, length: int) -> None:
        """Tabulate cos and signed sin for positions 0..length-1 with the model's own rotary module."""
        positions = torch.arange(length, device=self.device)[None]  # (1, L)
        probe = torch.empty(1, dtype=self.dtype, device=self.device)
        cos, sin = self.model.model.rotary_emb(probe, positions)  # (1, L, D) each
        cos, sin = cos[0].to(self.dtype), sin[0].to(self.dtype)
        if cos.shape[-1] != self.head_dim:
            raise UnsupportedModelError(
                "partial rotary embeddings are not supported by the fast path"
            )
        half = self.head_dim // 2
        self.cos, self.signed_sin = cos, torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)

    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Copy slot `src` into slot `dst` (positions `0..length-1`, all layers)."""
        for cache in (self.k, self.v):
            for layer in cache:
                layer[dst, :, :length] = layer[src, :, :length]

    copy_slot = move_slot

    def truncate(self, slots: int) -> None:
        """Nothing to free: slots past the active count are simply overwritten later."""

    def release(self) -> None:
        """Drop the cache tensors and weight copies; the next forward allocates them again."""
        self.release_cache()
        self.weights_changed()

    # --- forward ----------------------------------------------------------------------------
    def weights_changed(self) -> None:
        """Drop the weight copies (fused, packed); the next forward rebuilds them from the new weights."""
        for c in [*(self.copies or []), *([self.head] if self.head else [])]:
            c.invalidate()

    def _current_copies(self) -> list[LayerCopies | None]:
        """Each layer's up-to-date weight copies (None per layer when neither fused nor packed)."""
        if self.head is not None:
            self.head.current()
        if self.copies is None:
            return [None] * len(self.layers)
        return [c.current() for c in self.copies]

    def _qkv(
        self,
        layer: Any,
        copies: LayerCopies | None,
        x: torch.Tensor,
        rope_q: tuple[torch.Tensor, torch.Tensor],
        rope_k: tuple[torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Project normalised hidden states `(..., hidden)` to roped q, k and v `(..., heads, D)`.

        `rope_q` / `rope_k` are (cos, signed_sin) tables shaped `(..., 1, D)`; the decode path folds
        the attention scale into the query's.
        """
        attn = layer.self_attn
        lead = x.shape[:-1]
        if copies is None:
            q, k, v = _linear(x, attn.q_proj), _linear(x, attn.k_proj), _linear(x, attn.v_proj)
        else:
            q, k, v = copies.qkv(x)
        q = q.view(*lead, self.num_heads, self.head_dim)
        k = k.view(*lead, self.num_kv_heads, self.head_dim)
        v = v.view(*lead, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = _rms_norm(q, attn.q_norm), _rms_norm(k, attn.k_norm)
        return _rope(q, *rope_q), _rope(k, *rope_k), v

    def _attn_out(self, layer: Any, copies: LayerCopies | None, out: torch.Tensor) -> torch.Tensor:
        """The attention's output projection (o_proj)."""
        return _linear(out, layer.self_attn.o_proj) if copies is None else copies.o(out)

    def _mlp(self, layer: Any, copies: LayerCopies | None, h: torch.Tensor) -> torch.Tensor:
        """Post-attention norm + SwiGLU MLP + residual."""
        mlp = layer.mlp
        x = _rms_norm(h, layer.post_attention_layernorm)
        if copies is None:
            gate, up = _linear(x, mlp.gate_proj), _linear(x, mlp.up_proj)
            return h + _linear(F.silu(gate) * up, mlp.down_proj)
        gate, up = copies.gate_up(x)
        return h + copies.down(F.silu(gate) * up)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head on the selected hidden states `(n, hidden)` -> `(n, V)`."""
        x = _rms_norm(h, self.model.model.norm)
        return _linear(x, self.model.lm_head) if self.head is None else self.head(x)

    def prefill(
        self, prompts: list[list[int]], first_slot: int, starts: list[int] | None = None
    ) -> torch.Tensor:
        """Run prompts through the model into slots `first_slot...`; return last-token logits `(m, V)`.

        `starts[i]` positions of prompt i are already in its slot (loaded from the prefix cache);
        only the rest is computed. Prompts are right-padded to one width; padding is never cached.
        """
        m = len(prompts)
        starts = starts or [0] * m
        suffixes = [p[s:] for p, s in zip(prompts, starts, strict=True)]
        width = max(len(tail) for tail in suffixes)
        ids = torch.zeros(m, width, dtype=torch.long)
        for i, tail in enumerate(suffixes):
            ids[i, : len(tail)] = torch.tensor(tail, dtype=torch.long)
        lens = torch.tensor([len(tail) for tail in suffixes], device=self.device)  # (m,)
        plan = _PrefillPlan(first_slot, m, width)
        if any(starts):
            plan.offsets(self, torch.tensor(starts, device=self.device), lens)
        h = F.embedding(ids.to(self.device), self.model.model.embed_tokens.weight)  # (m, T, hidden)
        copies = self._current_copies()
        for i, layer in enumerate(self.layers):
            x = _rms_norm(h, layer.input_layernorm)
            out = self._prefill_attention(i, layer, copies[i], x, plan)  # (m, T, H*D)
            h = self._mlp(layer, copies[i], h + self._attn_out(layer, copies[i], out))
        h_last = h[torch.arange(m, device=self.device), lens - 1]  # (m, hidden)
        return self._logits(h_last)

    def _prefill_attention(
        self, i: int, layer: Any, copies: LayerCopies | None, x: torch.Tensor, plan: _PrefillPlan
    ) -> torch.Tensor:
        """Attention of one layer over a prefill batch; caches the new keys and values."""
        m, width, dim = plan.m, plan.width, self.head_dim
        slots = slice(plan.first_slot, plan.first_slot + m)
        if plan.mask is None:  # fresh prompts: positions 0..T-1, plain causal attention
            rope = (self.cos[:width, None], self.signed_sin[:width, None])  # (T, 1, D)
            q, k, v = self._qkv(layer, copies, x, rope, rope)  # (m, T, heads, D)
            k, v = k.transpose(1, 2), v.transpose(1, 2)  # (m, Hkv, T, D)
            self.k[i][slots, :, :width] = k
            self.v[i][slots, :, :width] = v
            mask, causal = None, True
        else:  # continuing cached prefixes: write the real tokens, attend over the slot's cache
            q, k, v = self._qkv(layer, copies, x, plan.rope, plan.rope)
            self.k[i].view(-1, dim).index_copy_(0, plan.rows, k[plan.valid].reshape(-1, dim))
            self.v[i].view(-1, dim).index_copy_(0, plan.rows, v[plan.valid].reshape(-1, dim))
            k, v = self.k[i][slots, :, : plan.span], self.v[i][slots, :, : plan.span]
            mask, causal = plan.mask, False
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k,
            v,
            attn_mask=mask,
            is_causal=causal,
            scale=self.scale,
            enable_gqa=True,
        )  # (m, H, T, D)
        return out.transpose(1, 2).reshape(m, width, -1)

    def export_slot(self, slot: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of slot `slot`'s keys and values for positions `0..length-1`: (layers, Hkv, L, D)."""
        keys = torch.stack([layer[slot, :, :length] for layer in self.k])
        return keys, torch.stack([layer[slot, :, :length] for layer in self.v])

    def import_slot(self, slot: int, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        """Load the first `length` positions of exported keys/values into slot `slot`."""
        for cache, exported in ((self.k, keys), (self.v, values)):
            for layer, part in zip(cache, exported, strict=True):
                layer[slot, :, :length] = part[:, :length]

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One token for each active slot `0..n-1`; return next-token logits `(n, V)`."""
        n, dim = tokens.shape[0], self.head_dim
        tokens, positions = tokens.to(self.device), positions.to(self.device)
        span = int(positions.max()) + 1  # cached positions any slot can see
        keys_pos = torch.arange(span, device=self.device)
        allowed = (keys_pos[None, :] <= positions[:, None])[:, None, None, :]  # (n, 1, 1, L)
        cos, sin = self.cos[positions, None], self.signed_sin[positions, None]  # (n, 1, D)
        rope_q, rope_k = (cos * self.scale, sin * self.scale), (cos, sin)
        # Row of each (slot, kv head, position) in one layer's cache viewed as (S * Hkv * cap, D).
        heads = torch.arange(self.num_kv_heads, device=self.device)
        slot_heads = torch.arange(n, device=self.device)[:, None] * self.num_kv_heads + heads
        rows = (slot_heads * self._allocated[1] + positions[:, None]).reshape(-1)  # (n * Hkv,)
        h = F.embedding(tokens, self.model.model.embed_tokens.weight)  # (n, hidden)
        copies = self._current_copies()
        for i, layer in enumerate(self.layers):
            x = _rms_norm(h, layer.input_layernorm)
            q, k, v = self._qkv(layer, copies[i], x, rope_q, rope_k)  # (n, heads, D); q scaled
            self.k[i].view(-1, dim).index_copy_(0, rows, k.reshape(-1, dim))
            self.v[i].view(-1, dim).index_copy_(0, rows, v.reshape(-1, dim))
            keys, values = self.k[i][:n, :, :span], self.v[i][:n, :, :span]  # (n, Hkv, L, D)
            out = F.scaled_dot_product_attention(
                q[:, :, None, :], keys, values, attn_mask=allowed, scale=1.0, enable_gqa=True
            ).reshape(n, -1)  # (n, H*D)
            h = self._mlp(layer, copies[i], h + self._attn_out(layer, copies[i], out))
        return self._logits(h)
