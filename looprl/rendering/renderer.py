"""Token-exact rendering: prompt ids from the chat template, and appending environment turns.

Sampled tokens are never decoded and re-encoded into the context. After an assistant turn the
environment's messages are appended by rendering only the new suffix:

1. render the conversation up to and including the assistant turn (no generation prompt) and
   the whole new conversation (with the generation prompt) with the tokenizer's chat template;
2. check token for token that the first is a prefix of the second (the template only appends);
3. the context grows by the *glue* the template puts after an assistant message that the model
   did not sample itself (for ChatML: the newline after `<|im_end|>`, or the whole closing when
   the turn ended on a stop string) and by the suffix tokens. Both carry mask 0.

Where a template rewrites history (some drop earlier `<think>` blocks), step 2 fails: the
caller starts a new training segment whose prompt is the full re-rendering, and counts it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from looprl.types import Message

_SENTINEL = "\u2063LOOPRL_SENTINEL\u2063"


@dataclass
class Extension:
    """How to extend the context after an assistant turn.

    When `ok`, append `glue_ids` then `suffix_ids` (both mask 0). When not `ok` (the template
    broke the prefix property), start a new segment whose prompt is `full_ids`.
    """

    ok: bool
    glue_ids: list[int]
    suffix_ids: list[int]
    full_ids: list[int]


Tools = list[dict[str, Any]]


class Renderer:
    """Renders messages to token ids with a tokenizer's chat template.

    The tools offered to the model are given per call (`tools=`), so one renderer serves every
    environment of a mixture; `tools` given to the constructor are the default for calls that
    pass none (convenient for SFT data and tests).
    """

    def __init__(self, tokenizer: Any, tools: Tools | None = None) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                "the tokenizer has no chat template; load the model with looprl.models.load_model "
                "(which installs looprl's tool-capable ChatML template) or set tokenizer.chat_template"
            )
        self.tokenizer = tokenizer
        self.tools = tools or []
        self.closing = self._assistant_closing()

    def render_text(
        self, messages: list[Message], *, add_generation_prompt: bool, tools: Tools | None = None
    ) -> str:
        """The chat template's text for `messages`, offering `tools` (default: the renderer's)."""
        offered = self.tools if tools is None else tools
        kwargs: dict[str, Any] = {}
        if offered:
            kwargs["tools"] = offered
        text = self.tokenizer.apply_chat_template(
            [m.to_template() for m in messages],
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        )
        return str(text)

    def encode(self, text: str) -> list[int]:
        """Token ids of template text (special tokens in the text are matched, none added)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def render_ids(
        self, messages: list[Message], *, add_generation_prompt: bool, tools: Tools | None = None
    ) -> list[int]:
        """Token ids of the rendered conversation."""
        text = self.render_text(messages, add_generation_prompt=add_generation_prompt, tools=tools)
        return self.encode(text)

    def prompt_ids(self, messages: list[Message], tools: Tools | None = None) -> list[int]:
        """Ids of a conversation ready for the next assistant turn."""
        return self.render_ids(messages, add_generation_prompt=True, tools=tools)

    def decode(self, ids: list[int]) -> str:
        """Text of sampled ids without special tokens (for parsing and display only)."""
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def extend(
        self,
        before: list[Message],
        after: list[Message],
        sampled_ids: list[int],
        tools: Tools | None = None,
    ) -> Extension:
        """Compute glue and suffix ids after the assistant turn that ends `before`.

        `before` ends with the assistant message whose tokens were `sampled_ids`; `after` is
        `before` plus the environment's new messages.
        """
        prev_ids = self.render_ids(before, add_generation_prompt=False, tools=tools)
        full_ids = self.render_ids(after, add_generation_prompt=True, tools=tools)
        if full_ids[: len(prev_ids)] != prev_ids:
            return Extension(ok=False, glue_ids=[], suffix_ids=[], full_ids=full_ids)
        sampled_text = str(self.tokenizer.decode(sampled_ids, skip_special_tokens=False))
        glue_ids = self.encode(_missing_tail(sampled_text, self.closing))
        return Extension(
            ok=True, glue_ids=glue_ids, suffix_ids=full_ids[len(prev_ids) :], full_ids=full_ids
        )

    def _assistant_closing(self) -> str:
        """The text the template writes after an assistant message's content."""
        msgs = [Message(role="user", content="hi"), Message(role="assistant", content=_SENTINEL)]
        text = self.render_text(msgs, add_generation_prompt=False)
        idx = text.rfind(_SENTINEL)
        if idx < 0:
            raise ValueError(
                "the chat template dropped the assistant content; cannot render exactly"
            )
        return text[idx + len(_SENTINEL) :]


def _missing_tail(sampled: str, closing: str) -> str:
    """The part of `closing` the sampled text did not already end with.

    If the model sampled the end-of-turn token itself, only what follows it is missing (e.g. a
    newline); if generation stopped on a stop string, the whole closing is missing.
    """
    for k in range(len(closing), 0, -1):
        if sampled.endswith(closing[:k]):
            return closing[k:]
    return closing
