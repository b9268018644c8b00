"""Batched forward passes with a slot-based KV cache: a fast path for Llama-family models, HF fallback.

Two backends share one small interface (`reserve`, `prefill`, `decode`, `move_slot`, `truncate`):

- `LlamaKVModel` runs its own forward for Llama, Mistral, SmolLM2, Qwen2 (qkv bias) and Qwen3 (q/k
  norm). It reads every weight from the Hugging Face module at each call (`layer.self_attn.q_proj.
  weight`, ...), never copying it, so in-place updates by a trainer (or a parameter replaced by
  `load_state_dict(assign=True)`) are seen on the next step. Keys and values live in one preallocated
  tensor per kind, `(layers, slots, kv_heads, capacity, head_dim)`, grown by doubling when needed.
- `HFCacheModel` calls the model's own forward with its own cache, one sequence at a time. It is
  slower but works for any causal LM and is used when `LlamaKVModel` does not support a model.

Active sequences always occupy slots `0..n-1` (the engine moves the last sequence into a freed slot),
so decoding reads plain views of the cache and never gathers.
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


class UnsupportedModelError(ValueError):
    """Raised when `LlamaKVModel` cannot run a model exactly; the engine then falls back to HF."""


class KVBackend(Protocol):
    """What the engine needs from a backend. Slot i holds the KV cache of the i-th active sequence."""

    def reserve(self, slots: int, length: int) -> None:
        """Make room for `slots` sequences of up to `length` cached tokens."""
        ...

    def prefill(self, prompts: list[list[int]], first_slot: int) -> torch.Tensor:
        """Cache `prompts` into slots `first_slot...`; return next-token logits `(len(prompts), V)`."""
        ...

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Feed one token per slot `0..n-1` at `positions`; return next-token logits `(n, V)`."""
        ...

    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Copy the first `length` cached positions of slot `src` into slot `dst`."""
        ...

    def truncate(self, slots: int) -> None:
        """Forget slots `slots...` (their sequences are finished)."""
        ...


def _next_size(need: int, current: int, minimum: int, limit: int) -> int:
    """Smallest power-of-two multiple of `minimum` that is >= `need` (capped at `limit`)."""
    size = max(current, minimum)
    while size < need:
        size *= 2
    return min(size, limit)


def _rms_norm(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """RMSNorm exactly as HF Llama/Qwen compute it (in float32, weight applied in the input dtype)."""
    if x.dtype == torch.float32 and norm.weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)  # one fused kernel
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * h.to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """HF's `x * cos + rotate_half(x) * sin`, with rotate_half's sign folded into `signed_sin`.

    rotate_half(x) = cat(-x2, x1) = roll(x, D/2) * [-1.., +1..], and HF's sin is cat(s, s).
    """
    return torch.addcmul(x * cos, torch.roll(x, x.shape[-1] // 2, dims=-1), signed_sin)


def _linear(x: torch.Tensor, proj: nn.Module) -> torch.Tensor:
    """Apply an `nn.Linear` through its current weight and bias (no copy)."""
    return F.linear(x, proj.weight, proj.bias)


def _check_supported(model: nn.Module) -> None:
    """Raise UnsupportedModelError unless the model has the Llama-family layout we implement."""
    cfg = model.config
    if cfg.model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"model_type {cfg.model_type!r} has no fast path; supported: {SUPPORTED_MODEL_TYPES}"
        )
    inner = getattr(model, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if inner is None or not all(hasattr(inner, n) for n in needed) or not hasattr(model, "lm_head"):
        raise UnsupportedModelError("model lacks model.{embed_tokens,layers,norm,rotary_emb}/lm_head")
    rope_type = getattr(inner.rotary_emb, "rope_type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"RoPE type {rope_type!r} depends on the sequence length and is not supported by the "
            f"fast path (supported: {SUPPORTED_ROPE_TYPES}); use backend='hf' for this model"
        )
    act = getattr(cfg, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise UnsupportedModelError(f"hidden_act {act!r} is not SwiGLU; use backend='hf'")


def sliding_window_limit(config: Any) -> int | None:
    """The sliding-attention window if any layer uses one, else None (full attention everywhere)."""
    window = getattr(config, "sliding_window", None)
    if window is None:
        return None
    layer_types = getattr(config, "layer_types", None)
    if config.model_type == "mistral" or (layer_types and "sliding_attention" in layer_types):
        return int(window)
    return None


class LlamaKVModel:
    """Fast batched forward for Llama-family models over a slot-based preallocated KV cache.

    `max_slots` bounds the number of concurrent sequences and `max_seq_len` the cached positions per
    sequence. Memory is allocated lazily and grown by doubling, so large limits cost nothing upfront.
    Sliding-window models are supported up to their window (within it, attention is full).
    """

    def __init__(self, model: nn.Module, *, max_slots: int, max_seq_len: int) -> None:
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
        self.device, self.dtype = weight.device, weight.dtype
        shape = (len(self.layers), 0, self.num_kv_heads, 0, self.head_dim)
        self.k = torch.empty(shape, dtype=self.dtype, device=self.device)
        self.v = torch.empty(shape, dtype=self.dtype, device=self.device)
        self.cos = torch.empty(0, self.head_dim, dtype=self.dtype, device=self.device)
        self.sin = torch.empty_like(self.cos)

    # --- cache management -------------------------------------------------------------------
    def reserve(self, slots: int, length: int) -> None:
        """Grow the cache (copying what it holds) so it fits `slots` x `length`."""
        if slots > self.max_slots or length > self.max_seq_len:
            raise ValueError(f"cache request {slots}x{length} exceeds {self.max_slots}x{self.max_seq_len}")
        cur_slots, cur_len = self.k.shape[1], self.k.shape[3]
        if slots <= cur_slots and length <= cur_len:
            return
        new_slots = _next_size(slots, cur_slots, 4, self.max_slots)
        new_len = _next_size(length, cur_len, 256, self.max_seq_len)
        shape = (len(self.layers), new_slots, self.num_kv_heads, new_len, self.head_dim)
        for name in ("k", "v"):
            old = getattr(self, name)
            new = torch.zeros(shape, dtype=self.dtype, device=self.device)
            new[:, :cur_slots, :, :cur_len] = old
            setattr(self, name, new)
        if new_len > self.cos.shape[0]:
            self._build_rope(new_len)

    def _build_rope(self, length: int) -> None:
        """Tabulate cos/sin for positions 0..length-1 with the model's own rotary module."""
        positions = torch.arange(length, device=self.device)[None]  # (1, L)
        probe = torch.empty(1, dtype=self.dtype, device=self.device)
        cos, sin = self.model.model.rotary_emb(probe, positions)  # (1, L, D) each
        self.cos, self.sin = cos[0].to(self.dtype), sin[0].to(self.dtype)

    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Copy slot `src` into slot `dst` (positions `0..length-1`, all layers)."""
        self.k[:, dst, :, :length] = self.k[:, src, :, :length]
        self.v[:, dst, :, :length] = self.v[:, src, :, :length]

    def truncate(self, slots: int) -> None:
        """Nothing to free: slots past the active count are simply overwritten later."""

    # --- forward ----------------------------------------------------------------------------
    def _qkv(
        self, layer: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Project normalised hidden states `(..., T, hidden)` to roped q, k and v `(..., T, heads, D)`."""
        attn = layer.self_attn
        lead = x.shape[:-1]
        q = _linear(x, attn.q_proj).view(*lead, self.num_heads, self.head_dim)
        k = _linear(x, attn.k_proj).view(*lead, self.num_kv_heads, self.head_dim)
        v = _linear(x, attn.v_proj).view(*lead, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = _rms_norm(q, attn.q_norm), _rms_norm(k, attn.k_norm)
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # broadcast over heads
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        return q, k, v

    def _mlp(self, layer: nn.Module, h: torch.Tensor) -> torch.Tensor:
        """Post-attention norm + SwiGLU MLP + residual."""
        mlp = layer.mlp
        x = _rms_norm(h, layer.post_attention_layernorm)
        return h + _linear(F.silu(_linear(x, mlp.gate_proj)) * _linear(x, mlp.up_proj), mlp.down_proj)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head on the selected hidden states `(n, hidden)` -> `(n, V)`."""
        return _linear(_rms_norm(h, self.model.model.norm), self.model.lm_head)

    def prefill(self, prompts: list[list[int]], first_slot: int) -> torch.Tensor:
        """Run right-padded prompts through the model, caching keys/values; return last-token logits."""
        m, width = len(prompts), max(len(p) for p in prompts)
        ids = torch.zeros(m, width, dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, : len(p)] = torch.tensor(p, dtype=torch.long)
        ids = ids.to(self.device)
        last = torch.tensor([len(p) - 1 for p in prompts], device=self.device)  # (m,)
        slots = slice(first_slot, first_slot + m)
        cos, sin = self.cos[:width], self.sin[:width]  # (T, D)
        h = F.embedding(ids, self.model.model.embed_tokens.weight)  # (m, T, hidden)
        for i, layer in enumerate(self.layers):
            x = _rms_norm(h, layer.input_layernorm)
            q, k, v = self._qkv(layer, x, cos, sin)  # (m, T, heads, D)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (m, heads, T, D)
            self.k[i, slots, :, :width] = k
            self.v[i, slots, :, :width] = v
            out = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=self.scale, enable_gqa=True
            )  # (m, H, T, D)
            out = out.transpose(1, 2).reshape(m, width, -1)  # (m, T, H*D)
            h = self._mlp(layer, h + _linear(out, layer.self_attn.o_proj))
        h_last = h[torch.arange(m, device=self.device), last]  # (m, hidden)
        return self._logits(h_last)

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One token for each active slot `0..n-1`; return next-token logits `(n, V)`."""
        n = tokens.shape[0]
        tokens, positions = tokens.to(self.device), positions.to(self.device)
        span = int(positions.max()) + 1  # cached positions any slot can see
        rows = torch.arange(n, device=self.device)
        hidden_mask = torch.arange(span, device=self.device)[None, :] > positions[:, None]  # (n, L)
        bias = torch.zeros(n, 1, 1, span, dtype=self.dtype, device=self.device)
        bias.masked_fill_(hidden_mask[:, None, None, :], float("-inf"))  # (n, 1, 1, L)
        cos, sin = self.cos[positions], self.sin[positions]  # (n, D)
        groups = self.num_heads // self.num_kv_heads
        h = F.embedding(tokens, self.model.model.embed_tokens.weight)  # (n, hidden)
        for i, layer in enumerate(self.layers):
            x = _rms_norm(h, layer.input_layernorm)
            q, k, v = self._qkv(layer, x, cos, sin)  # (n, heads, D)
            self.k[i, rows, :, positions] = k
            self.v[i, rows, :, positions] = v
            keys = self.k[i, :n, :, :span]  # (n, Hkv, L, D)
            values = self.v[i, :n, :, :span]
            q = q.view(n, self.num_kv_heads, groups, self.head_dim)  # (n, Hkv, G, D)
            scores = torch.matmul(q, keys.transpose(-1, -2)) * self.scale + bias  # (n, Hkv, G, L)
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(self.dtype)
            out = torch.matmul(probs, values).reshape(n, -1)  # (n, H*D)
            h = self._mlp(layer, h + _linear(out, layer.self_attn.o_proj))
        return self._logits(h)


class HFCacheModel:
    """Fallback backend: the model's own forward and cache, one sequence at a time (any causal LM)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        params = inspect.signature(model.forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"
        self.device = next(model.parameters()).device
        self.caches: list[Any] = []

    def reserve(self, slots: int, length: int) -> None:
        """Grow the per-slot cache list."""
        self.caches.extend([None] * (slots - len(self.caches)))

    def prefill(self, prompts: list[list[int]], first_slot: int) -> torch.Tensor:
        """Run each prompt alone and keep its cache."""
        rows = []
        for i, prompt in enumerate(prompts):
            ids = torch.tensor([prompt], dtype=torch.long, device=self.device)
            out = self.model(input_ids=ids, use_cache=True)
            self.caches[first_slot + i] = out.past_key_values
            rows.append(out.logits[0, -1])
        return torch.stack(rows)

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Feed one token per active slot through that slot's own cache."""
        rows = []
        for i, (tok, pos) in enumerate(zip(tokens.tolist(), positions.tolist(), strict=True)):
            ids = torch.tensor([[tok]], dtype=torch.long, device=self.device)
            pos_ids = torch.tensor([[pos]], dtype=torch.long, device=self.device)
            kwargs = {self.cache_arg: self.caches[i]}
            out = self.model(input_ids=ids, position_ids=pos_ids, use_cache=True, **kwargs)
            self.caches[i] = out.past_key_values
            rows.append(out.logits[0, -1])
        return torch.stack(rows)

    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Hand slot `src`'s cache object to slot `dst`."""
        self.caches[dst] = self.caches[src]

    def truncate(self, slots: int) -> None:
        """Drop the caches of finished sequences."""
        for i in range(slots, len(self.caches)):
            self.caches[i] = None
