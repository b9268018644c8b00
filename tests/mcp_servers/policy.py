"""A scripted policy for the MCP command in docs/environments.md: note the question on the MCP
server (`notes_remember`), then solve it as the calculator teacher does."""

from __future__ import annotations

import json

from looprl.sft.teachers import calculator
from looprl.types import Message


def note_then_calculate(messages: list[Message]) -> str:
    """First turn: `notes_remember` the question (an MCP tool); then the calculator teacher's turns."""
    if not any(m.role == "tool" for m in messages):
        question = next(m.content for m in messages if m.role == "user")
        call = {"name": "notes_remember", "arguments": {"text": question}}
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
    return calculator(messages)
