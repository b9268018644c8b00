"""Reasoning blocks: split a turn's leading `<think>...</think>` from its answer and tool calls.

Rules, decided here once:

- only a *leading* block counts: after optional whitespace the turn opens with the marker, or
  the turn holds a closing marker and no opening one (the generation prompt opened the block,
  as DeepSeek-R1 and Qwen3-Thinking templates do);
- an opening marker never closed (the turn hit its token limit while thinking) makes the whole
  rest reasoning, and the answer is empty;
- the reasoning is kept without its markers and without the newlines that pad it (Qwen3's
  template writes `<think>\\n...\\n</think>\\n\\n`); the answer is the text after the block;
- a `<think>` block later in the turn stays in the answer text, where `looprl.kit.answer_text`
  still hides it from rubrics.

The markers are `<think>` / `</think>` unless the chat template declares others (Magistral's
`[THINK]` / `[/THINK]`): `reasoning_markers(template_text)` picks them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReasoningMarkers:
    """The text that opens and closes a reasoning block."""

    open: str = "<think>"
    """Opens the block (`<think>`)."""
    close: str = "</think>"
    """Closes the block (`</think>`)."""


THINK = ReasoningMarkers()
"""`<think>` ... `</think>`: Qwen3, DeepSeek-R1, SmolLM3 and most open reasoning models."""
MISTRAL_THINK = ReasoningMarkers("[THINK]", "[/THINK]")
"""`[THINK]` ... `[/THINK]`: Mistral's Magistral models (control tokens)."""
KNOWN_MARKERS = (MISTRAL_THINK, THINK)
"""Checked in this order against a template's text; `THINK` when none is mentioned."""


def reasoning_markers(template_text: str) -> ReasoningMarkers:
    """The markers a chat template declares (the first of `KNOWN_MARKERS` it mentions)."""
    for markers in KNOWN_MARKERS:
        if markers.open in template_text and markers.close in template_text:
            return markers
    return THINK


def reasoning_field(template_text: str) -> str | None:
    """The message field a chat template reads past reasoning from: `reasoning_content` (the
    Hugging Face convention: Qwen3, DeepSeek-R1), `thinking` (gpt-oss), or None when neither."""
    if "reasoning_content" in template_text:
        return "reasoning_content"
    return "thinking" if "message.thinking" in template_text else None


def split_reasoning(text: str, markers: ReasoningMarkers = THINK) -> tuple[str, str]:
    """`(reasoning, rest)` of an assistant turn (see the module doc); `("", text)` when none."""
    stripped = text.lstrip()
    if stripped.startswith(markers.open):
        body = stripped[len(markers.open) :]
        end = body.find(markers.close)
        if end < 0:
            return body.strip("\n"), ""
        return body[:end].strip("\n"), body[end + len(markers.close) :]
    end = text.find(markers.close)
    if end >= 0 and markers.open not in text[:end]:
        return text[:end].strip("\n"), text[end + len(markers.close) :]
    return "", text
