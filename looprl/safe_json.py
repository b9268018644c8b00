"""Strict JSON for everything a model may have written: valid UTF-8, no NaN, never an exception.

A model can write any string, and JSON can carry strings that are not valid Unicode (a lone
surrogate escape such as the six characters backslash-u-d-8-0-0) or numbers that strict JSON
has no spelling for (NaN, Infinity, 1e999). Python's `json` accepts both and then fails later,
when the text is encoded to UTF-8 for a file or read by a strict reader. Every writer of
episodes, metadata and metrics goes through `dumps`, which returns text that encodes to UTF-8
and that any JSON reader accepts:

- lone surrogates become U+FFFD (a surrogate pair written as two escapes is joined first);
- non-finite floats become `null`;
- keys that are not strings become strings; values JSON cannot say become their `str`;
- nesting deeper than `MAX_DEPTH` is cut (the value becomes a marker string).

The fast path is one `json.dumps` plus one UTF-8 encode; the repair walk runs only when that fails.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_DEPTH = 200
"""Deepest nesting written; deeper values become a marker string (json's C encoder recurses)."""

REPLACEMENT = "\ufffd"


def clean_text(text: str) -> str:
    """`text` with lone surrogates replaced by U+FFFD (surrogate pairs are joined); else unchanged."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def sanitize(value: Any, depth: int = 0) -> Any:
    """A copy of `value` that strict JSON can hold as valid UTF-8 (see the module doc)."""
    if isinstance(value, str):
        return clean_text(value)
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if depth >= MAX_DEPTH:
        return f"[nested deeper than {MAX_DEPTH} levels: cut]"
    if isinstance(value, dict):
        return {_key(k): sanitize(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [sanitize(v, depth + 1) for v in value]
    try:
        text = str(value)
    except Exception as exc:  # a broken __str__ must not break a writer
        text = f"<unprintable {type(value).__name__}: {type(exc).__name__}>"
    return clean_text(text)


def _key(key: Any) -> str:
    return clean_text(key if isinstance(key, str) else str(key))


def dumps(value: Any, *, indent: int | None = None, sort_keys: bool = False) -> str:
    """Strict JSON text for `value` that always encodes to UTF-8; never raises."""
    try:
        text = json.dumps(
            value, ensure_ascii=False, allow_nan=False, indent=indent, sort_keys=sort_keys
        )
        text.encode("utf-8")
        return text
    except (ValueError, TypeError, RecursionError):  # UnicodeEncodeError is a ValueError
        pass
    return json.dumps(
        sanitize(value), ensure_ascii=False, allow_nan=False, indent=indent, sort_keys=sort_keys
    )


def jsonable_part(obj: Any) -> Any:
    """What JSON can hold of per-episode state: `obj` itself when `json.dumps` takes it; else a
    dict with each value JSON cannot hold (a handle, a client) replaced by its `repr`, or the
    `repr` of anything else."""
    try:
        json.dumps(obj)
        return obj
    except (TypeError, ValueError):
        if isinstance(obj, dict):
            out = {}
            for k, v in obj.items():
                try:
                    json.dumps(v)
                    out[str(k)] = v
                except (TypeError, ValueError):
                    out[str(k)] = repr(v)
            return out
        return repr(obj)


def loads_strict(text: str | bytes) -> Any:
    """Parse JSON, refusing NaN and Infinity (what `dumps` writes always parses here)."""
    return json.loads(text, parse_constant=_reject_constant)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")
