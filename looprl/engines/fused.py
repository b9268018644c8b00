"""Fused projection weights for the torch engine's fast path (opt-in): q/k/v in one matrix, gate/up in another.

A decoder layer then runs 4 matmuls instead of 7 (q, k, v, o, gate, up, down). The copies are kept
current by comparing the source tensors with those they were built from: see `FusedLayer.current`.
"""

from __future__ import annotations

from typing import Any

import torch


class FusedLayer:
    """One layer's q/k/v weights (and biases) in one matrix and gate/up in another, kept current.

    `current()` compares the source tensors (identity and autograd `_version`) with those the
    copies were built from and rebuilds them on any change; holding the sources keeps a replaced
    tensor's memory from being reused under the same address.
    """

    def __init__(self, layer: Any) -> None:
        self.layer = layer
        self.sources: list[torch.Tensor] = []
        self.versions: list[int] = []
        self.qkv: tuple[torch.Tensor, torch.Tensor | None] = (torch.empty(0), None)  # weight, bias
        self.gate_up = torch.empty(0)

    def _tensors(self) -> list[torch.Tensor]:
        """The source weights and biases, read from the layer now (modules may be replaced)."""
        attn, mlp = self.layer.self_attn, self.layer.mlp
        mods = (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj)
        return [t for m in mods for t in (m.weight, m.bias) if t is not None]

    def current(self) -> FusedLayer:
        """Rebuild the fused copies if any source weight changed; return self."""
        tensors = self._tensors()
        versions = [t._version for t in tensors]
        same = len(tensors) == len(self.sources) and all(
            a is b for a, b in zip(tensors, self.sources, strict=True)
        )
        if not same or versions != self.versions:
            self._build()
            self.sources, self.versions = tensors, versions
        return self

    def invalidate(self) -> None:
        """Forget the sources so that the next `current()` rebuilds."""
        self.sources, self.versions = [], []

    def _build(self) -> None:
        """Concatenate q/k/v (rows) and gate/up (rows) from the layer's current weights."""
        attn, mlp = self.layer.self_attn, self.layer.mlp
        qkv = (attn.q_proj, attn.k_proj, attn.v_proj)
        with torch.no_grad():
            weight = torch.cat([m.weight.detach() for m in qkv])  # (Nq + 2 Nkv, hidden)
            bias = None
            if any(m.bias is not None for m in qkv):
                bias = torch.cat(
                    [
                        m.bias.detach()
                        if m.bias is not None
                        else m.weight.new_zeros(m.out_features)
                        for m in qkv
                    ]
                )
            self.qkv = (weight, bias)
            self.gate_up = torch.cat([mlp.gate_proj.weight.detach(), mlp.up_proj.weight.detach()])
