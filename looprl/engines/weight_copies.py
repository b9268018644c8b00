"""Derived copies of the torch engine's weights, kept current: fused projections and MKL-packed matrices.

Two opt-ins of the fast path (`looprl.engines.kv_model.LlamaKVModel`):

- **fused**: q/k/v in one matrix and gate/up in another, so a decoder layer runs 4 matmuls instead
  of 7 (q, k, v, o, gate, up, down);
- **packed**: every layer matrix and the LM head of `PACK_MIN_WEIGHTS` or more packed once in MKL's sgemm layout
  (`torch.ops.mkl._mkl_reorder_linear_weight`). A plain sgemm re-packs the whole weight at every
  call; for the few rows of a decode step that copy costs as much as the product, so a packed
  weight runs the same product 1.3-2x faster at 4-64 rows on one thread (benchmarks/engine.py,
  docs/benchmarks.md "Decode on CPU"). The packed copy takes 2-3x the weight's memory; it is
  dropped whenever the weights change and rebuilt at the next forward. Products are those of the
  unpacked matmul within float rounding (equal from 16 rows on, ~1e-6 at 4-15; tests).

Copies are rebuilt when a source tensor is another object or its autograd version counter moved
(`Copies.current`), and after `invalidate()` (an update that bypasses the counter).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

Product = Callable[[torch.Tensor], Any]  # x -> a tensor, or a tuple of them (q/k/v, gate/up)

PACK_HINT_ROWS = 64  # MKL's packed layout of the weight does not depend on the rows (checked once)
PACKED_ROWS = (4, 256)  # below: MKL uses matrix-vector code anyway; above: no faster than plain
PACK_MIN_WEIGHTS = (
    300_000  # smaller matrices lose to the packed call's few microseconds of overhead
)


@functools.cache
def mkl_packing_works() -> bool:
    """Whether this torch has MKL's packed sgemm and it reproduces `F.linear` at any row count.

    The packed weight is built once for `PACK_HINT_ROWS` rows and used for every row count; this
    checks on a small random matrix that MKL agrees (false on builds without MKL, e.g. ARM).
    """
    ops = getattr(torch.ops, "mkl", None)
    if not torch.backends.mkl.is_available() or ops is None:
        return False
    try:
        gen = torch.Generator().manual_seed(0)
        weight = torch.randn(96, 80, generator=gen)
        packed = ops._mkl_reorder_linear_weight(weight, PACK_HINT_ROWS)
        for rows in (4, 7, 64, 100):
            x = torch.randn(rows, 80, generator=gen)
            got = ops._mkl_linear(x, packed, weight, None, rows)
            if not torch.allclose(got, F.linear(x, weight), rtol=1e-5, atol=1e-5):
                return False
    except (RuntimeError, AttributeError):
        return False
    return True


class PackedLinear:
    """`x @ weight.T + bias` with the weight packed once for MKL (float32 on CPU; module doc)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight, self.bias = weight, bias
        self.packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, PACK_HINT_ROWS)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The product for `x` `(..., in)` -> `(..., out)`; plain `F.linear` outside PACKED_ROWS."""
        flat = x.reshape(-1, x.shape[-1])
        rows = flat.shape[0]
        if not PACKED_ROWS[0] <= rows <= PACKED_ROWS[1]:
            return F.linear(x, self.weight, self.bias)
        out = torch.ops.mkl._mkl_linear(flat, self.packed, self.weight, self.bias, rows)
        return out.view(*x.shape[:-1], out.shape[-1])


def _plain(proj: Any) -> Any:
    """`proj`'s product as a function of x (its own weight and bias, read at call time)."""
    return lambda x: F.linear(x, proj.weight, proj.bias)


def _product(weight: torch.Tensor, bias: torch.Tensor | None, pack: bool) -> Product:
    """`x @ weight.T + bias` over a packed copy when `pack` and the matrix is large enough."""
    if pack and weight.numel() >= PACK_MIN_WEIGHTS:
        return PackedLinear(weight, bias)
    return functools.partial(F.linear, weight=weight, bias=bias)


def worth_packing(model: Any) -> bool:
    """Whether any matrix of `model`'s decoder layers or LM head is large enough to pack."""
    mods = [model.lm_head, *(m for layer in model.model.layers for m in _layer_modules(layer))]
    return any(m.weight.numel() >= PACK_MIN_WEIGHTS for m in mods)


def _layer_modules(layer: Any) -> list[Any]:
    attn, mlp = layer.self_attn, layer.mlp
    return [
        attn.q_proj,
        attn.k_proj,
        attn.v_proj,
        attn.o_proj,
        mlp.gate_proj,
        mlp.up_proj,
        mlp.down_proj,
    ]


class Copies:
    """Copies built from source tensors, rebuilt when any of them changed (identity or
    `_version`). Holding the sources keeps a replaced tensor's memory from being reused under the
    same address."""

    def __init__(self) -> None:
        self.sources: list[torch.Tensor] = []
        self.versions: list[int] = []

    def _tensors(self) -> list[torch.Tensor]:
        raise NotImplementedError

    def _build(self) -> None:
        raise NotImplementedError

    def current(self) -> Any:
        """Rebuild the copies if any source changed; return self."""
        tensors = self._tensors()
        versions = [t._version for t in tensors]
        same = len(tensors) == len(self.sources) and all(
            a is b for a, b in zip(tensors, self.sources, strict=True)
        )
        if not same or versions != self.versions:
            with torch.no_grad():
                self._build()
            self.sources, self.versions = tensors, versions
        return self

    def invalidate(self) -> None:
        """Forget the sources and drop the copies' memory; the next `current()` rebuilds."""
        self.sources, self.versions = [], []
        self._drop()

    def _drop(self) -> None:
        raise NotImplementedError


class LayerCopies(Copies):
    """One decoder layer's products over its copies: `qkv`, `gate_up`, `o`, `down` (module doc).

    `fuse` concatenates q/k/v and gate/up; `pack` packs every matrix for MKL. The functions read
    the copies built at the last `current()`.
    """

    def __init__(self, layer: Any, *, fuse: bool, pack: bool) -> None:
        super().__init__()
        self.layer, self.fuse, self.pack = layer, fuse, pack
        self._drop()

    def _drop(self) -> None:
        empty = torch.empty(0)
        self.qkv: Product = lambda x: empty
        self.gate_up: Product = lambda x: empty
        self.o: Product = lambda x: empty
        self.down: Product = lambda x: empty

    def _modules(self) -> list[Any]:
        """The projections copied: all seven when packing, else the five that fusion joins."""
        mods = _layer_modules(self.layer)  # q, k, v, o, gate, up, down
        return mods if self.pack else [m for i, m in enumerate(mods) if i not in (3, 6)]

    def _tensors(self) -> list[torch.Tensor]:
        """The source weights and biases, read from the layer now (modules may be replaced)."""
        return [t for m in self._modules() for t in (m.weight, m.bias) if t is not None]

    def _build(self) -> None:
        attn, mlp = self.layer.self_attn, self.layer.mlp
        linear = (
            PackedLinear
            if self.pack
            else lambda w, b: functools.partial(F.linear, weight=w, bias=b)
        )
        if self.fuse:
            qkv = linear(*_stack((attn.q_proj, attn.k_proj, attn.v_proj)))
            sizes = [attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features]
            self.qkv = lambda x: qkv(x).split(sizes, dim=-1)
            gate_up = linear(*_stack((mlp.gate_proj, mlp.up_proj)))
            self.gate_up = lambda x: gate_up(x).chunk(2, dim=-1)
        else:
            q, k, v = (
                linear(m.weight.detach(), _bias(m)) for m in (attn.q_proj, attn.k_proj, attn.v_proj)
            )
            self.qkv = lambda x: (q(x), k(x), v(x))
            gate, up = (linear(m.weight.detach(), _bias(m)) for m in (mlp.gate_proj, mlp.up_proj))
            self.gate_up = lambda x: (gate(x), up(x))
        if self.pack:
            self.o = linear(attn.o_proj.weight.detach(), _bias(attn.o_proj))
            self.down = linear(mlp.down_proj.weight.detach(), _bias(mlp.down_proj))
        else:
            self.o, self.down = _plain(attn.o_proj), _plain(mlp.down_proj)


class HeadCopy(Copies):
    """The LM head packed for MKL (`pack` of the module doc), kept current like a layer's copies."""

    def __init__(self, head: Any) -> None:
        super().__init__()
        self.head = head
        self._drop()

    def _drop(self) -> None:
        self.linear: Any = None

    def _tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.head.weight, self.head.bias) if t is not None]

    def _build(self) -> None:
        self.linear = _product(self.head.weight.detach(), _bias(self.head), True)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The head's product for `x` over the packed copy (call `current()` first)."""
        return self.linear(x)


def _bias(module: Any) -> torch.Tensor | None:
    return None if module.bias is None else module.bias.detach()


def _stack(modules: tuple[Any, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The modules' weights concatenated by rows, and their biases (zeros where one has none)."""
    weight = torch.cat([m.weight.detach() for m in modules])
    if all(m.bias is None for m in modules):
        return weight, None
    zeros = [m.weight.new_zeros(m.out_features) for m in modules]
    bias = torch.cat(
        [z if m.bias is None else m.bias.detach() for m, z in zip(modules, zeros, strict=True)]
    )
    return weight, bias
