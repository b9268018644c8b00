"""Tools: typed Python functions offered to the model, their schemas, and their concurrent execution."""

from looprl.tools.executor import (
    ERROR_KINDS,
    EXCEPTION,
    INVALID_ARGUMENT,
    MALFORMED_JSON,
    MCP_ERROR,
    MISSING_ARGUMENT,
    TIMEOUT,
    TRUNCATED,
    UNAVAILABLE,
    UNEXPECTED_ARGUMENT,
    UNKNOWN_TOOL,
    ToolError,
    ToolExecutor,
    ToolReply,
    ToolResult,
    count_tool_errors,
)
from looprl.tools.hung import ToolsHung
from looprl.tools.schema import Hidden, Tool, make_tool, make_tools, parse_docstring, tool_schema
from looprl.tools.source import FunctionTools, ToolSource

__all__ = [
    "ERROR_KINDS",
    "EXCEPTION",
    "MCP_ERROR",
    "INVALID_ARGUMENT",
    "MALFORMED_JSON",
    "MISSING_ARGUMENT",
    "TIMEOUT",
    "TRUNCATED",
    "UNAVAILABLE",
    "UNEXPECTED_ARGUMENT",
    "UNKNOWN_TOOL",
    "FunctionTools",
    "Hidden",
    "Tool",
    "ToolError",
    "ToolExecutor",
    "ToolReply",
    "ToolResult",
    "ToolSource",
    "ToolsHung",
    "count_tool_errors",
    "make_tool",
    "make_tools",
    "parse_docstring",
    "tool_schema",
]
