"""Rendering: chat templates, token-exact rendering and tool-call parsing."""

from looprl.rendering.formats import get_parser
from looprl.rendering.parser import HermesParser, ParsedTurn, ParseError, ToolCallParser
from looprl.rendering.renderer import Renderer
from looprl.rendering.templates import ensure_tool_template, template_supports_tools

__all__ = [
    "HermesParser",
    "ParseError",
    "ParsedTurn",
    "Renderer",
    "ToolCallParser",
    "ensure_tool_template",
    "get_parser",
    "template_supports_tools",
]
