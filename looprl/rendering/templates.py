"""looprl's tool-capable ChatML chat template, and helpers to install it on a tokenizer.

`CHATML_TOOLS_TEMPLATE` is a Hugging Face chat template (Jinja, used through
`tokenizer.apply_chat_template(messages, tools=..., add_generation_prompt=...)`) that renders:

    <|im_start|>system
    {system content}

    # Tools
    ...instructions...
    <tools>
    {"type": "function", "function": {...}}      <- one tool schema per line, as given
    </tools>
    ...how to call...<|im_end|>
    <|im_start|>user
    {content}<|im_end|>
    <|im_start|>assistant
    {content}
    <tool_call>
    {"name": "calculate", "arguments": {"expression": "2 + 2"}}
    </tool_call><|im_end|>
    <|im_start|>tool
    {content}<|im_end|>
    <|im_start|>assistant
                                                  <- the generation prompt

Why this format: the tool calls are the Hermes / Qwen2.5 style (`<tool_call>` + one JSON object
with `name` and `arguments` + `</tool_call>`), which many open models already produce and which
`looprl.rendering.parser.HermesParser` reads. The system section is used only when `tools` are
given; without tools and without a system message nothing is added (no default system prompt).
When tools are given and the conversation has no system message, a short one is generated.

The template is *prefix-safe*, which token-exact rollouts depend on (see DESIGN.md section 2):
every message renders on its own, independently of the messages after it, so

- rendering `messages[:k]` is a string prefix of rendering `messages[:k + n]`, and
- rendering `messages[:k]` with the generation prompt is a prefix of rendering
  `messages[:k] + [assistant message]`.

For that reason, unlike Qwen2.5's template, consecutive tool messages are not merged into one
turn and no earlier content is ever rewritten. Tool-call arguments given as a dict are written
with `tojson` (one line, keys in the given order); given as a string, they are written as is.
The template writes every piece of text through string literals, so it renders the same under
any Jinja whitespace settings (`trim_blocks`, `lstrip_blocks`).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

CHATML_TOOLS_TEMPLATE = (
    "{#- looprl ChatML template with tool calls (looprl/rendering/templates.py) -#}\n"
    "{%- macro text_of(content) -%}\n"
    "{%- if content is string -%}{{- content -}}\n"
    "{%- elif content is iterable and content is not mapping -%}\n"
    "{%- for part in content -%}\n"
    "{%- if part is mapping and part.type == 'text' -%}{{- part.text -}}{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- endif -%}\n"
    "{%- endmacro -%}\n"
    "{%- macro tools_section() -%}\n"
    "{{- '\\n\\n# Tools\\n\\nYou can call the tools listed below. Each line between <tools> and "
    "</tools> is the JSON schema of one tool:\\n<tools>' -}}\n"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}\n"
    "{{- '\\n</tools>\\n\\nTo call a tool, write a JSON object with its name and arguments "
    "between <tool_call> and </tool_call> tags, one block per call:\\n<tool_call>\\n"
    '{"name": "tool_name", "arguments": {"argument": "value"}}\\n</tool_call>\' -}}\n'
    "{%- endmacro -%}\n"
    "{%- if tools and ((messages | length > 0 and messages[0].role != 'system') "
    "or (messages | length == 0 and add_generation_prompt)) -%}\n"
    "{{- '<|im_start|>system\\nYou are a helpful assistant that can call tools.' -}}\n"
    "{{- tools_section() -}}\n"
    "{{- '<|im_end|>\\n' -}}\n"
    "{%- endif -%}\n"
    "{%- for message in messages -%}\n"
    "{%- set text = text_of(message.content) -%}\n"
    "{%- if message.role == 'system' and loop.first and tools -%}\n"
    "{{- '<|im_start|>system\\n' + text -}}{{- tools_section() -}}{{- '<|im_end|>\\n' -}}\n"
    "{%- elif message.role == 'assistant' -%}\n"
    "{{- '<|im_start|>assistant\\n' + text -}}\n"
    "{%- if message.tool_calls -%}\n"
    "{%- for call in message.tool_calls -%}\n"
    "{%- set fn = call.function if call.function is defined else call -%}\n"
    "{%- if not loop.first or text | length > 0 -%}{{- '\\n' -}}{%- endif -%}\n"
    "{{- '<tool_call>\\n{\"name\": ' + (fn.name | tojson) + ', \"arguments\": ' -}}\n"
    "{%- if fn.arguments is string -%}{{- fn.arguments -}}\n"
    "{%- elif fn.arguments is defined and fn.arguments is not none -%}"
    "{{- fn.arguments | tojson -}}\n"
    "{%- else -%}{{- '{}' -}}{%- endif -%}\n"
    "{{- '}\\n</tool_call>' -}}\n"
    "{%- endfor -%}\n"
    "{%- endif -%}\n"
    "{{- '<|im_end|>\\n' -}}\n"
    "{%- else -%}\n"
    "{{- '<|im_start|>' + message.role + '\\n' + text + '<|im_end|>\\n' -}}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}\n"
)
"""Tool-capable, prefix-safe ChatML template (see the module docstring for the format)."""

CHATML_MARKERS = ("<|im_start|>", "<|im_end|>")
"""The control tokens the template writes; a tokenizer should know each as one token."""


def _template_texts(tokenizer: Any) -> list[str]:
    """All chat template texts of a tokenizer (a template may be one string or a dict of named ones)."""
    template = getattr(tokenizer, "chat_template", None)
    if template is None:
        return []
    if isinstance(template, str):
        return [template]
    if isinstance(template, dict):
        return [t for t in template.values() if isinstance(t, str)]
    if isinstance(template, list):  # older format: [{"name": ..., "template": ...}]
        return [t["template"] for t in template if isinstance(t, dict) and "template" in t]
    return []


def template_text(tokenizer: Any) -> str:
    """All of a tokenizer's chat template texts, joined (what format detection reads)."""
    return "\n".join(_template_texts(tokenizer))


LOOPRL_TEMPLATE = "looprl"
"""The `--model.chat_template` value that selects `CHATML_TOOLS_TEMPLATE`."""


def check_template_choice(choice: str | None) -> str | None:
    """`choice` when it is None, `looprl` or an existing file; else ValueError saying what to give."""
    if choice is not None and choice != LOOPRL_TEMPLATE and not Path(choice).expanduser().is_file():
        raise ValueError(
            f"no such file {choice!r}; give a Jinja chat template file, a tokenizer_config.json, "
            f"or {LOOPRL_TEMPLATE!r} for looprl's prefix-safe ChatML template"
        )
    return choice


def load_chat_template(choice: str) -> str:
    """The template text `--model.chat_template` names: `looprl`, or a Jinja file's path.

    A `tokenizer_config.json` is read for its `chat_template` string. Raises ValueError naming
    the flag when the file is missing or holds no template.
    """
    if choice == LOOPRL_TEMPLATE:
        return CHATML_TOOLS_TEMPLATE
    try:
        check_template_choice(choice)
    except ValueError as exc:
        raise ValueError(f"--model.chat_template: {exc}") from None
    path = Path(choice).expanduser()
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        template = json.loads(text).get("chat_template")
        if not isinstance(template, str):
            raise ValueError(
                f"--model.chat_template {choice!r}: the file has no chat_template string; give "
                "the Jinja template file itself"
            )
        text = template
    if not text.strip():
        raise ValueError(f"--model.chat_template {choice!r}: the file is empty")
    return text


def set_chat_template(tokenizer: Any, choice: str | None) -> None:
    """Install the template `choice` names on `tokenizer` (None: keep the tokenizer's own).

    `looprl` on a tokenizer without `<|im_start|>` / `<|im_end|>` tokens warns as
    `ensure_tool_template` does.
    """
    if choice is None:
        return
    text = load_chat_template(choice)
    if choice == LOOPRL_TEMPLATE:
        _warn_missing_markers(tokenizer)
    tokenizer.chat_template = text


def _warn_missing_markers(tokenizer: Any) -> None:
    vocab = tokenizer.get_vocab()
    missing = [m for m in CHATML_MARKERS if m not in vocab]
    if missing:
        warnings.warn(
            f"installing looprl's ChatML tool template on a tokenizer without the tokens {missing}; "
            "they will be split into ordinary tokens. Add them as special tokens "
            "(tokenizer.add_special_tokens) and resize the model's embeddings to avoid this.",
            stacklevel=3,
        )


def template_supports_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template appears to render `tools` (it mentions the variable).

    A heuristic: a template that never reads `tools` silently drops the tool list, so the model
    would never learn what it can call.
    """
    return any("tools" in text for text in _template_texts(tokenizer))


def ensure_tool_template(tokenizer: Any) -> bool:
    """Install `CHATML_TOOLS_TEMPLATE` on `tokenizer` when its own template lacks tool support.

    Returns True when the template was replaced, False when the tokenizer's template was kept.
    Warns when the tokenizer does not know `<|im_start|>` / `<|im_end|>` as single tokens (the
    template still renders, but the markers are then spelled out in several ordinary tokens).
    """
    if template_supports_tools(tokenizer):
        return False
    _warn_missing_markers(tokenizer)
    tokenizer.chat_template = CHATML_TOOLS_TEMPLATE
    return True
