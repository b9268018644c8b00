"""A seeded generator of hostile model text: tool-call blocks with broken, strict-JSON-breaking,
deep or huge JSON, lone surrogates (escaped and raw), near-miss tags, control characters.

Used by the fuzz tests and the soak benchmark; the same seed gives the same texts.
"""

from __future__ import annotations

import json
import random

TOOL_NAMES = ["calculate", "nosuch", "", "calc ulate", "\u0000", "caLculate"]

_ATOMS = [
    "\\ud800",
    "\\udfff",
    "\\ud83d\\ude00",  # a valid pair written as two escapes
    "\\u0000",
    "NaN",
    "Infinity",
    "-Infinity",
    "1e999",
    "9" * 5000,
    "-0",
    "1.5e-400",
    "true",
    "null",
    '"\\"\\\\"',
]

_RAW = ["\ud800", "\udc00", "\x00", "\x1b[31m", "\u202e", "\ufeff", "😀", "\r\n", "\t", "</", "<"]

_TAGS = [
    "<tool_call>",
    "</tool_call>",
    "<TOOL_CALL>",
    "< tool_call >",
    "<tool-call>",
    "</Tool_Call>",
    "<toolcall/>",
    "<tool_call >",
]


def random_json(rng: random.Random, depth: int = 0) -> str:
    """A JSON-ish value: mostly valid, often strict-JSON-breaking, sometimes garbage."""
    roll = rng.random()
    if depth > 4 or roll < 0.35:
        return rng.choice(
            [*_ATOMS, json.dumps(rng.choice(["2+2", "x", "7*6", ""])), str(rng.randint(-9, 99))]
        )
    if roll < 0.45:
        n = rng.choice([40, 1000, 100_000])
        return "[" * n + "1" + "]" * rng.choice([0, n])
    if roll < 0.7:
        items = [random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]
        return "[" + ",".join(items) + "]"
    keys = [rng.choice(['"expression"', '"a"', '"\\ud800"', '""', '"arguments"']) for _ in range(3)]
    body = ",".join(f"{k}: {random_json(rng, depth + 1)}" for k in keys[: rng.randint(0, 3)])
    return "{" + body + ("" if rng.random() < 0.1 else "}")


def random_call(rng: random.Random) -> str:
    """One tool-call block, well-formed or not."""
    name = json.dumps(rng.choice(TOOL_NAMES))
    if rng.random() < 0.2:
        name = rng.choice(['"\\ud800"', "NaN", "[1]", "null"])
    args = random_json(rng)
    if rng.random() < 0.3:
        args = json.dumps(args)  # double-encoded
    key = rng.choice(["arguments", "parameters", "arguments"])
    body = "{" + f'"name": {name}, "{key}": {args}' + "}"
    if rng.random() < 0.1:
        body = rng.choice([random_json(rng), "{" + f'"{key}": {args}' + "}"])  # no object, no name
    open_tag, close_tag = "<tool_call>", "</tool_call>"
    if rng.random() < 0.2:
        open_tag, close_tag = rng.choice(_TAGS), rng.choice(_TAGS)
    if rng.random() < 0.1:
        close_tag = ""
    return f"{open_tag}\n{body}\n{close_tag}"


def model_text(rng: random.Random, *, raw_surrogates: bool = True) -> str:
    """One assistant turn of hostile text (raw lone surrogates only when `raw_surrogates`).

    Token-level engines decode valid Unicode, so their text never holds a raw lone surrogate;
    message-level engines return whatever a server's JSON said, which can.
    """
    parts: list[str] = []
    for _ in range(rng.randint(1, 4)):
        roll = rng.random()
        if roll < 0.45:
            parts.append(random_call(rng))
        elif roll < 0.6:
            parts.append(rng.choice(_TAGS))
        elif roll < 0.8:
            raw = [r for r in _RAW if raw_surrogates or not ("\ud800" <= r <= "\udfff")]
            parts.append("".join(rng.choice(raw) for _ in range(rng.randint(1, 5))))
        else:
            parts.append(rng.choice(["The answer is 4.", "4", "", "answer: \\ud800", "{"]))
    return " ".join(parts)
