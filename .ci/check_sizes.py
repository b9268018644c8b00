"""Size gate for `make lint`: modules of at most 500 lines, functions of at most 80.

Counts physical lines of each `.py` file under the given folders, and each function's lines from
its `def` to its last line (decorators and docstring included). Prints every offender and
exits 1 when there is one.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MAX_MODULE = 500
MAX_FUNCTION = 80


def offenders(root: Path) -> list[str]:
    """`path:line: what` for every module or function over its budget under `root`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if any(part.startswith(".") for part in path.relative_to(root).parts):
            continue  # virtual environments and caches (benchmarks/.venvs)
        text = path.read_text(encoding="utf-8")
        lines = text.count("\n") + (not text.endswith("\n") and bool(text))
        if lines > MAX_MODULE:
            found.append(f"{path}:1: module has {lines} lines (at most {MAX_MODULE})")
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                size = (node.end_lineno or node.lineno) - start + 1
                if size > MAX_FUNCTION:
                    found.append(
                        f"{path}:{node.lineno}: function {node.name} has {size} lines "
                        f"(at most {MAX_FUNCTION})"
                    )
    return found


def main(argv: list[str]) -> int:
    """Check every folder named on the command line."""
    found = [line for arg in argv for line in offenders(Path(arg))]
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
