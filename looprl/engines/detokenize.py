"""Incremental decoding of sampled tokens, used to spot stop strings as soon as a token completes one."""

from __future__ import annotations

from typing import Any


class StopStringWatcher:
    """Follows one sequence's decoded text, token by token, and reports when a stop string appears.

    Each step decodes only a short window of recent tokens (the previous chunk as context plus the
    new ones), as streaming detokenizers do, so the cost per token does not grow with the length.
    Text ending in an incomplete UTF-8 character ("\ufffd") waits for the next token.
    """

    def __init__(self, tokenizer: Any, stops: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stops = [s for s in stops if s]
        self.longest = max((len(s) for s in self.stops), default=0)
        self.text = ""
        self.prefix_offset = 0  # start of the context window in `tokens`
        self.read_offset = 0  # tokens before this one are already in `text`

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def add(self, tokens: list[int]) -> bool:
        """Account for the newest token of `tokens` (all sampled so far); True if a stop string completed."""
        if not self.stops:
            return False
        prefix = self._decode(tokens[self.prefix_offset : self.read_offset])
        window = self._decode(tokens[self.prefix_offset :])
        if len(window) <= len(prefix) or window.endswith("\ufffd"):
            return False  # nothing printable yet (partial character)
        new = window[len(prefix) :]
        start = max(0, len(self.text) - self.longest + 1)
        self.text += new
        self.prefix_offset, self.read_offset = self.read_offset, len(tokens)
        tail = self.text[start:]
        return any(s in tail for s in self.stops)
