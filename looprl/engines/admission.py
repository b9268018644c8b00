"""Which waiting requests a TorchEngine admits: a free slot each, and room in the KV cache's budget."""

from __future__ import annotations

import logging
import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import torch

from looprl.engines.kv_model import KVBackend
from looprl.engines.sequence import EngineStats, SequenceState

logger = logging.getLogger(__name__)


@dataclass
class Admission:
    """Admits waiting requests in arrival order while each has a slot and the cache that every
    admitted sequence could grow to (its prompt plus `max_tokens`, within `max_seq_len`) fits
    `budget` bytes (`KVBackend.cache_bytes`). One request alone is always admitted; a request
    that does not fit waits, and the ones behind it too (no overtaking)."""

    backend: KVBackend
    budget: int
    max_seq_len: int
    stats: EngineStats
    _noted: bool = field(default=False, init=False)

    def take(
        self, waiting: deque[SequenceState], active: list[SequenceState], max_slots: int
    ) -> list[SequenceState]:
        """Pop from `waiting` the requests to admit beside `active` (cancelled ones are dropped)."""
        longest = max((self.final_len(s) for s in active), default=0)
        taken: list[SequenceState] = []
        while waiting and len(active) + len(taken) < max_slots:
            s = waiting[0]
            if s.cancelled:
                waiting.popleft()
                continue
            length = max(longest, self.final_len(s))
            slots = len(active) + len(taken) + 1
            if slots > 1 and self.backend.cache_bytes(slots, length) > self.budget:
                self._note(slots - 1, length)
                break
            taken.append(waiting.popleft())
            longest = length
        return taken

    def final_len(self, s: SequenceState) -> int:
        """The positions `s` may reach: its prompt plus `max_tokens`, within the context."""
        return min(len(s.prompt) + s.sampling.max_tokens, self.max_seq_len)

    def _note(self, running: int, length: int) -> None:
        """Count an admission the budget put off; say so once (what it holds, and the knob)."""
        self.stats.kv_waits += 1
        if not self._noted:
            self._noted = True
            logger.info(
                "TorchEngine: the KV cache budget (%d MB) holds %d sequences of up to %d "
                "positions; more requests wait for them (kv_cache_mb sets the budget)",
                self.budget // 2**20, running, length,
            )  # fmt: skip


def kv_budget_bytes(kv_cache_mb: int | None, device: torch.device) -> int:
    """The budget in bytes: `kv_cache_mb` MiB, or `default_kv_budget(device)` when None."""
    if kv_cache_mb is None:
        return default_kv_budget(device)
    if kv_cache_mb < 1:
        raise ValueError(
            f"kv_cache_mb must be >= 1, got {kv_cache_mb}; leave it unset for a quarter of the "
            "device's memory"
        )
    return kv_cache_mb * 2**20


def default_kv_budget(device: torch.device) -> int:
    """A quarter of the memory of `device`: the GPU's, or the machine's RAM (its cgroup limit
    when that is lower)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory // 4)
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        limit = "max"
    if limit.isdigit():
        total = min(total, int(limit))
    return total // 4
