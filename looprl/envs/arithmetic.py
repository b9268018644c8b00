"""Safe arithmetic for the calculator tool: an `ast` walk, no `eval`, standard library only.

Standard library only on purpose: the peer benchmarks' workers (benchmarks/trl_worker.py,
benchmarks/verifiers_worker.py) run in virtual environments without looprl and load this file by
path, so every framework's tool computes exactly the same results.
"""

from __future__ import annotations

import ast
import operator

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_MAX_ABS = 10**30


def safe_eval(expression: str) -> int | float:
    """Evaluate an arithmetic expression without `eval`: numbers, + - * / // % ** and parentheses."""
    if len(expression) > 200:
        raise ValueError("expression is longer than 200 characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from exc
    return _eval_node(tree.body)


def _eval_node(node: ast.AST) -> int | float:
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _eval_node(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval_node(node.left), _eval_node(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("exponent larger than 64")
        result = _BINOPS[type(node.op)](left, right)
        if abs(result) > _MAX_ABS:
            raise ValueError("result too large")
        return result
    raise ValueError(f"unsupported syntax: {ast.dump(node)[:60]}")


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: The expression, e.g. (12 + 3) * 4.
    """
    value = safe_eval(expression)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)
