"""The support desk's refund policy, and the MCP stdio server that offers it as `refund_policy`.

`python -m looprl.envs.support_policy` serves one tool, `refund_policy(category)`, over stdio
(the `mcp` extra); `support_desk` starts it itself. The table is read here by the rubric too, so
the policy the model looks up is the one it is scored against.
"""

from __future__ import annotations

REFUND_DAYS = {"electronics": 30, "clothing": 60, "books": 14, "toys": 45}
"""Days after delivery within which a delivered order of each category may be refunded."""


def policy_text(category: str) -> str:
    """The refund rule of a category, as the tool states it (ValueError naming the categories)."""
    if category not in REFUND_DAYS:
        raise ValueError(f"unknown category {category!r}; use one of {sorted(REFUND_DAYS)}")
    return (
        f"Refunds for {category}: delivered orders only, within {REFUND_DAYS[category]} days "
        "of delivery. Orders not yet delivered cannot be refunded."
    )


def main() -> None:
    """Serve `refund_policy` over stdio until stdin ends."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer("looprl-support-policy", log_level="WARNING")

    @server.tool()
    def refund_policy(category: str) -> str:
        """The refund rule for a product category (electronics, clothing, books, toys)."""
        try:
            return policy_text(category)
        except ValueError as exc:
            raise ToolError(str(exc)) from None

    server.run("stdio")


if __name__ == "__main__":
    main()
