"""Training precision: `model.dtype = "bfloat16"` computes in bf16 over float32 master weights.

float32 (the default) changes nothing. With bfloat16 the weights, gradients and AdamW state stay
float32 (the master copy the optimizer updates and checkpoints hold) and only the compute is bf16:

- under torchrun, FSDP2's `MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)`:
  each block's weights are gathered and cast to bf16 for its forward and backward, gradients
  are reduced over ranks in float32 (`shard_policy`);
- with one process, `torch.autocast(bfloat16)` around the forward (`for_scoring`), the usual
  equivalent: matmuls in bf16, reductions and the weights in float32.

Either way the logits and hidden states leave the model as float32, so log-softmax, losses and
the value head run in float32. The engine samples from the float32 weights. On CPU bf16 matmuls
are far slower than float32 ones (no bf16 units on most CPUs), so bf16 there gets a warning.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def compute_dtype(
    name: str, device: torch.device, warn: Callable[[str], None]
) -> torch.dtype | None:
    """The bf16 compute dtype, or None for float32 (nothing changes); `warn`s about bf16 on CPU."""
    dtype = DTYPES[name]
    if dtype is torch.float32:
        return None
    if device.type == "cpu":
        warn(
            "model.dtype = 'bfloat16' on CPU: bf16 matmuls are far slower than float32 here "
            "(measured ~100x on some CPUs); use model.dtype = 'float32' unless you test bf16"
        )
    return dtype


def shard_policy(dtype: torch.dtype | None) -> Any:
    """FSDP2's mixed-precision policy for `dtype` (None: float32, FSDP's default policy)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def upcast_output(out: Any) -> Any:
    """A Hugging Face model output with its logits and hidden states as float32."""
    for name in ("logits", "last_hidden_state"):
        value = getattr(out, name, None)
        if isinstance(value, torch.Tensor) and value.dtype != torch.float32:
            setattr(out, name, value.float())
    hidden = getattr(out, "hidden_states", None)
    if hidden is not None:
        out.hidden_states = tuple(h.float() for h in hidden)
    return out


class Autocast(torch.nn.Module):
    """A module whose forward runs under `torch.autocast(dtype)`, with float32 outputs."""

    def __init__(self, module: torch.nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.module = module
        self.dtype = dtype

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped forward in bf16 compute; logits and hidden states come back as float32."""
        device = next(self.module.parameters()).device.type
        with torch.autocast(device, dtype=self.dtype):
            out = self.module(*args, **kwargs)
        return out.float() if isinstance(out, torch.Tensor) else upcast_output(out)


class AutocastModel(Autocast):
    """A causal LM under autocast that keeps the model's `config`, decoder and head in view.

    `forward_logprobs` scores Llama-like models through `get_decoder()` and
    `get_output_embeddings()` (projecting only the trained positions); both come back wrapped
    in autocast too, so that path computes in bf16 like the plain forward.
    """

    @property
    def config(self) -> Any:
        """The wrapped model's config (its `model_type` picks the scoring path)."""
        return getattr(self.module, "config", None)

    def get_decoder(self) -> Autocast:
        """The decoder trunk, under autocast."""
        return Autocast(self.module.get_decoder(), self.dtype)  # type: ignore[operator]

    def get_output_embeddings(self) -> Autocast:
        """The output projection, under autocast."""
        return Autocast(self.module.get_output_embeddings(), self.dtype)  # type: ignore[operator]
