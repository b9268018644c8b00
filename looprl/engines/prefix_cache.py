"""Keys and values of finished turns, kept so the next turn of the same conversation skips their prefill.

In a multi-turn rollout each request's prompt is the previous prompt plus the sampled turn plus the
environment's reply. When a sequence finishes, the engine stores the keys/values of every position it
cached (prompt + sampled tokens but the last); a later prompt that starts with those tokens loads them
into its slot and prefills only the new suffix. Entries are taken (not shared) and evicted oldest
first beyond a byte budget.

Stale keys/values must never be reused after a weight update: `weights_fingerprint` samples a few
elements of every parameter, and the engine clears the cache whenever the fingerprint changes (this
catches in-place optimizer steps, which do not always bump tensor version counters).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

FINGERPRINT_SAMPLES = 8  # elements read per parameter
SHARED_PREFIX_MIN = 32  # shortest prefix common to several new prompts that is prefilled once


@dataclass
class PrefixEntry:
    """Cached positions `0..len(tokens)-1`: keys and values shaped (layers, kv_heads, len, head_dim)."""

    tokens: list[int]
    keys: torch.Tensor
    values: torch.Tensor

    @property
    def nbytes(self) -> int:
        """Memory held by the tensors."""
        return self.keys.nbytes + self.values.nbytes


class PrefixCache:
    """An LRU store of finished sequences' keys/values, looked up by prompt prefix."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.entries: OrderedDict[int, PrefixEntry] = OrderedDict()
        self.nbytes = 0
        self._next_id = 0
        self.fingerprint: torch.Tensor | None = None
        self.hits = 0
        self.reused_tokens = 0

    def put(self, entry: PrefixEntry) -> None:
        """Store an entry, evicting the oldest ones beyond the budget (an oversized entry is dropped)."""
        if entry.nbytes > self.budget_bytes or not entry.tokens:
            return
        self.entries[self._next_id] = entry
        self._next_id += 1
        self.nbytes += entry.nbytes
        while self.nbytes > self.budget_bytes:
            _, old = self.entries.popitem(last=False)
            self.nbytes -= old.nbytes

    def take(self, prompt: list[int]) -> tuple[int, PrefixEntry] | None:
        """Remove and return the entry sharing the longest usable prefix with `prompt`, and its length.

        At most `len(prompt) - 1` positions are reused: the last prompt token must be fed to get the
        next-token logits. An entry is usable when its tokens and the prompt agree on that prefix.
        """
        best: tuple[int, int] | None = None  # (usable length, entry id)
        for key, entry in self.entries.items():
            n = min(len(entry.tokens), len(prompt) - 1)
            if n > 0 and (best is None or n > best[0]) and entry.tokens[:n] == prompt[:n]:
                best = (n, key)
        if best is None:
            return None
        n, key = best
        entry = self.entries.pop(key)
        self.nbytes -= entry.nbytes
        self.hits += 1
        self.reused_tokens += n
        return n, entry

    def clear(self) -> None:
        """Forget every entry."""
        self.entries.clear()
        self.nbytes = 0

    def check_weights(self, model: Any) -> bool:
        """Clear the cache if the model's weights changed since the last check; True if they did."""
        current = weights_fingerprint(model)
        changed = self.fingerprint is not None and not torch.equal(current, self.fingerprint)
        if changed:
            self.clear()
        self.fingerprint = current
        return changed


def weights_fingerprint(model: Any) -> torch.Tensor:
    """A few strided elements of every parameter, concatenated: changes when training changes them."""
    samples = []
    for p in model.parameters():
        flat = p.detach().reshape(-1)
        step = max(1, flat.numel() // FINGERPRINT_SAMPLES)
        samples.append(flat[::step][:FINGERPRINT_SAMPLES].float())
    return torch.cat(samples)


def shared_prefix_len(prompts: list[list[int]]) -> int:
    """Positions every prompt starts with (0 below SHARED_PREFIX_MIN or for fewer than 2 prompts).

    At most `min(len) - 1`: each prompt keeps one token of its own to feed for its logits.
    """
    if len(prompts) < 2:
        return 0
    first, limit = prompts[0], min(len(p) for p in prompts) - 1
    n = 0
    while n < limit and all(p[n] == first[n] for p in prompts):
        n += 1
    return n if n >= SHARED_PREFIX_MIN else 0
