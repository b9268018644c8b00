"""Arithmetic for the calculator: random expressions for its tasks and the safe `calculate` tool.

`random_expression` draws a task's expression (operands of a chosen size); `safe_eval` evaluates
one by an `ast` walk, no `eval`; `calculate` is the tool the model calls.

Standard library only on purpose: the peer benchmarks' workers (benchmarks/trl_worker.py,
benchmarks/verifiers_worker.py) run in virtual environments without looprl and load this file by
path, so every framework's tool computes exactly the same results.
"""

from __future__ import annotations

import ast
import operator
import random
from collections.abc import Sequence

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
MAX_DIGITS = 6  # the largest operand size: a product of three is below 10**18, far under _MAX_ABS


def operand_sizes(digits: int | Sequence[int]) -> list[int]:
    """Operand sizes (digits per operand, 1..6) as a sorted list; ValueError names a bad one."""
    sizes = sorted({digits} if isinstance(digits, int) else set(digits))
    if not sizes or any(not isinstance(d, int) or not 1 <= d <= MAX_DIGITS for d in sizes):
        raise ValueError(
            f"digits={digits!r}: give operand sizes from 1 to {MAX_DIGITS}, one (3) or several "
            "([1, 2, 3])"
        )
    return sizes


def random_expression(rng: random.Random, sizes: Sequence[int]) -> tuple[str, int]:
    """Two operations on three operands of one size (`481 * 372 - 129`), and that size.

    The size is drawn from `sizes` only when there are several (with one, `rng` draws operands and
    operators alone). A 1-digit operand may be 0; larger ones have no leading zero.
    """
    size = sizes[0] if len(sizes) == 1 else rng.choice(sizes)
    low, high = 10 ** (size - 1) if size > 1 else 0, 10**size - 1
    terms = [str(rng.randint(low, high))]
    for _ in range(2):
        terms += [rng.choice(["+", "-", "*"]), str(rng.randint(low, high))]
    return " ".join(terms), size


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
