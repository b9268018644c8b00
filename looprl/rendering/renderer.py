"""Token-exact rendering: prompt ids from the chat template, and appending environment turns.

Sampled tokens are never decoded and re-encoded into the context. After an assistant turn the
environment's messages are appended by rendering only the new suffix:

1. render the conversation up to and including the assistant turn (no generation prompt) and
   the whole new conversation (with the generation prompt) with the tokenizer's chat template;
2. check token for token that the first is a prefix of the second (the template only appends),
   and that the prompt the turn was sampled from (the conversation before it, with the
   generation prompt) is a prefix of the first (answering did not move earlier content, as
   Mistral's template moves the system message onto whichever user message is last);
3. the context grows by the *glue* the template puts after an assistant message that the model
   did not sample itself (for ChatML: the newline after `<|im_end|>`, or the whole closing when
   the turn ended on a stop string) and by the suffix tokens. Both carry mask 0. A format that
   closes a call turn differently from an answer declares it (`call_closing`: harmony's
   `<|call|>`, where an answer ends in `<|return|>`), and a turn the template writes as a call
   is glued to that closing.

Where a template rewrites history (some drop earlier `<think>` blocks), step 2 fails: the
caller starts a new training segment whose prompt is the full re-rendering, and counts it.

The renderer also reads the model's side of the format: `parse` splits a sampled turn into its
leading reasoning block and its content and tool calls, with the parser the template declares
(`looprl.rendering.formats`). Past reasoning goes back to the template as `reasoning_content`
(the Hugging Face convention Qwen3's template reads; `thinking` for gpt-oss's) while
`keep_reasoning` is on; off, every turn that reasoned starts a new segment whose prompt lacks it
(the sampled ids are never edited, so dropping reasoning from the context costs a re-rendered
prompt, as it does in Qwen3). A parser that reads reasoning itself (`reads_reasoning`: harmony's
analysis channel) splits the whole turn; and where its template answers a tool message only after
a call (`written_calls`: harmony), a turn whose call was malformed is given to the template with
that call as written, so the tool message telling the model what went wrong renders.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from looprl.rendering.formats import resolve_parser
from looprl.rendering.parser import ParsedTurn, ToolCallParser
from looprl.rendering.reasoning import reasoning_field, reasoning_markers, split_reasoning
from looprl.rendering.templates import template_text
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
    pass none (convenient for SFT data and tests). `parser` is a name from
    `looprl.rendering.formats.PARSERS`, `auto` (the format the template declares) or a parser;
    `keep_reasoning` says whether past turns' reasoning stays in the prompt (module doc).
    """

    def __init__(
        self,
        tokenizer: Any,
        tools: Tools | None = None,
        *,
        parser: str | ToolCallParser = "auto",
        keep_reasoning: bool = True,
    ) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                "the tokenizer has no chat template; load the model with looprl.models.load_model "
                "(which installs looprl's tool-capable ChatML template) or set tokenizer.chat_template"
            )
        self.tokenizer = tokenizer
        self.tools = tools or []
        self.keep_reasoning = keep_reasoning
        text = template_text(tokenizer)
        self.parser = resolve_parser(parser, text) if isinstance(parser, str) else parser
        self.reasoning = reasoning_markers(text)
        self._reasoning_field = reasoning_field(text)
        self._dropped_ids = self._ids_decode_drops()
        self.closing = self._assistant_closing()
        self.call_closing: str = getattr(self.parser, "call_closing", self.closing)

    def render_text(
        self, messages: list[Message], *, add_generation_prompt: bool, tools: Tools | None = None
    ) -> str:
        """The chat template's text for `messages`, offering `tools` (default: the renderer's)."""
        return self._render(self._template_messages(messages), add_generation_prompt, tools)

    def _render(
        self, dicts: list[dict[str, Any]], add_generation_prompt: bool, tools: Tools | None
    ) -> str:
        """The template's text for messages already in its own format (`_template_messages`)."""
        offered = self.tools if tools is None else tools
        kwargs: dict[str, Any] = {}
        if offered:
            kwargs["tools"] = offered
        text = self.tokenizer.apply_chat_template(
            dicts, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
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
        """Text of sampled ids for parsing and display: special tokens dropped, except the ones
        the format needs (`[TOOL_CALLS]`, `<|python_tag|>`, harmony's, reasoning markers)."""
        kept = [i for i in ids if i not in self._dropped_ids]
        return str(self.tokenizer.decode(kept, skip_special_tokens=False))

    def parse(self, text: str) -> ParsedTurn:
        """A sampled turn's reasoning, content, tool calls and malformed calls."""
        if getattr(self.parser, "reads_reasoning", False):  # harmony's analysis channel
            return self.parser.parse(text)
        reasoning, rest = split_reasoning(text, self.reasoning)
        parsed = self.parser.parse(rest)
        parsed.reasoning = reasoning
        return parsed

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
        dicts = self._template_messages(after)  # the turn as the template writes it, answered
        turn = len(before) - 1
        prompt_ids = self.encode(self._render(dicts[:turn], True, tools))
        prev_ids = self.encode(self._render(dicts[: turn + 1], False, tools))
        full_ids = self.encode(self._render(dicts, True, tools))
        drop_reasoning = not self.keep_reasoning and bool(before and before[-1].reasoning_content)
        moved = prev_ids[: len(prompt_ids)] != prompt_ids  # the answer moved earlier content
        if drop_reasoning or moved or full_ids[: len(prev_ids)] != prev_ids:
            return Extension(ok=False, glue_ids=[], suffix_ids=[], full_ids=full_ids)
        sampled_text = str(self.tokenizer.decode(sampled_ids, skip_special_tokens=False))
        closing = self.call_closing if dicts[turn].get("tool_calls") else self.closing
        glue_ids = self.encode(_missing_tail(sampled_text, closing))
        return Extension(
            ok=True, glue_ids=glue_ids, suffix_ids=full_ids[len(prev_ids) :], full_ids=full_ids
        )

    def _template_messages(self, messages: list[Message]) -> list[dict[str, Any]]:
        """The messages as the template reads them; a malformed call answered by a tool message
        is given as written where the parser says how (`written_calls`, module doc)."""
        out = [self._template_message(m) for m in messages]
        written = getattr(self.parser, "written_calls", None)
        if written is None:
            return out
        for i, (message, following) in enumerate(zip(messages, messages[1:], strict=False)):
            if message.role == "assistant" and not message.tool_calls and following.role == "tool":
                calls = written(message.raw)
                if calls:
                    out[i]["tool_calls"] = calls
        return out

    def _template_message(self, message: Message) -> dict[str, Any]:
        """A message as the template reads it; past reasoning under the template's own field
        (`reasoning_content`, `thinking`) when kept, else inline where it was sampled."""
        out = message.to_template()
        reasoning = message.reasoning_content
        if not (self.keep_reasoning and reasoning):
            return out
        if self._reasoning_field == "thinking" and message.tool_calls:
            out["content"] = ""  # gpt-oss takes a call turn's analysis in one field, not both
        if self._reasoning_field:
            out[self._reasoning_field] = reasoning
        else:  # a template that ignores reasoning_content gets it inline, where it was sampled
            mark = self.reasoning
            out["content"] = f"{mark.open}\n{reasoning}\n{mark.close}\n\n{message.content}"
        return out

    def _ids_decode_drops(self) -> set[int]:
        """Special-token ids `decode` drops: all but the markers the parser and reasoning need."""
        tok = self.tokenizer
        special = set(getattr(tok, "all_special_ids", []))
        decoder = getattr(tok, "added_tokens_decoder", {})
        special |= {i for i, added in decoder.items() if getattr(added, "special", False)}
        needed = (*getattr(self.parser, "markers", ()), self.reasoning.open, self.reasoning.close)
        vocab = tok.get_vocab()
        return special - {vocab[m] for m in needed if m in vocab}

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


def prompt_renderer(engine: Any, tokenizer: Any, usage: str) -> Renderer | None:
    """The renderer a side model (a judge, a simulated user) needs for its prompts: one when
    `tokenizer` is given, None for a message-level engine. A token-level `engine` without a
    tokenizer is refused with `usage`, the call that passes one (e.g. `JudgeRubric(engine,
    tokenizer=...)`)."""
    if engine.token_level and tokenizer is None:
        raise ValueError(
            f"{type(engine).__name__} samples token ids: pass the model's tokenizer ({usage}) "
            "so its prompt can be rendered"
        )
    return Renderer(tokenizer) if tokenizer is not None else None
