"""The random-number state a checkpoint keeps (`rng.pt`, `rng_rank{R}.pt`), so a resumed run draws
the same numbers: python `random`, numpy, torch CPU and CUDA, and any named `torch.Generator`."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch


def rng_state(generators: Mapping[str, torch.Generator] | None) -> dict[str, Any]:
    """Every RNG state of this process (and of `generators`, by name), as `torch.save` stores it.

    numpy's key is kept as a tensor so that `torch.load(weights_only=True)` reads it back.
    """
    np_state = np.random.get_state(legacy=False)
    assert isinstance(np_state, dict)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "generators": {name: g.get_state() for name, g in (generators or {}).items()},
    }
    return state


def set_rng_state(state: dict[str, Any], generators: Mapping[str, torch.Generator] | None) -> None:
    """Restore what `rng_state` saved; KeyError names a generator the checkpoint has no state for."""
    random.setstate(state["python"])
    npd = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": npd["bit_generator"],
            "state": {"key": npd["key"].numpy().astype(np.uint32), "pos": npd["pos"]},
            "has_gauss": npd["has_gauss"],
            "gauss": npd["gauss"],
        }
    )
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        for device, cuda_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, device)
    saved = state["generators"]
    for name, gen in (generators or {}).items():
        if name not in saved:
            raise KeyError(
                f"checkpoint has no state for generator {name!r}; saved: {sorted(saved)}"
            )
        gen.set_state(saved[name])
