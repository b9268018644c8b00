"""The wordle environment: guess a secret five-letter word in six tries from per-letter feedback.

A multi-turn game written with one `env_response` hook and no tools. Each assistant turn must
hold a guess as `<guess>crane</guess>`; the environment answers with one symbol per letter:
`G` right letter in the right place, `Y` in the word but elsewhere, `-` not in the word (a
letter guessed twice is marked `Y` only as often as the secret holds it beyond its greens).
A reply without a guess, or a guess that is not a known five-letter word, is answered with
feedback and still uses up one of the six guesses: the batch never crashes on a bad move.

Words come from the `reasoning-gym` package's data files, read as text (the package itself is
not imported): targets are the 2,315 Wordle answer words, and valid guesses add every
five-letter word of its `words3to10.txt`. Targets are split by a hash of the word, one in five
to eval, so train and eval never share a secret word.

Two arguments make an easier game, a curriculum for small models: `pool=N` draws secrets from a
fixed set of N answer words (the same N every time), and `hint=K` adds to each feedback the
first K words of that set still consistent with every feedback so far (`Possible words: ...`),
so the player's task becomes reading the feedback and choosing among the words left.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import random
import re
from pathlib import Path
from typing import Any

import looprl
from looprl import split_of as hash_split

MAX_GUESSES = 6
SYSTEM_PROMPT = (
    "Let's play Wordle. Find the secret five-letter English word in at most 6 guesses. "
    "Write each guess in tags, like <guess>crane</guess>. After each guess you get one symbol "
    "per letter: G = right letter, right place; Y = in the word, wrong place; - = not in the word."
)
_GUESS_RE = re.compile(r"<guess>\s*([^<]*?)\s*</guess>", re.IGNORECASE)
_LISTED_RE = re.compile(r"^Possible words: (.*?)(?: \(and \d+ more\))?$", re.MULTILINE)


@functools.cache
def word_lists() -> tuple[tuple[str, ...], frozenset[str]]:
    """(target words, valid guesses), read from reasoning-gym's data files without importing it."""
    spec = importlib.util.find_spec("reasoning_gym")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "the wordle word list comes from the reasoning-gym package: pip install reasoning-gym"
        )
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    module = ast.parse((data / "wordle_words.py").read_text(encoding="utf-8"))
    assign = next(node for node in module.body if isinstance(node, ast.Assign))
    targets = tuple(sorted({w.lower() for w in ast.literal_eval(assign.value)}))
    extra = (
        w.strip().lower()
        for w in (data / "words3to10.txt").read_text(encoding="utf-8").splitlines()
    )
    valid = frozenset(targets) | {w for w in extra if len(w) == 5 and w.isalpha() and w.isascii()}
    return targets, valid


@functools.cache
def word_pool(size: int | None) -> tuple[str, ...]:
    """The answer words secrets come from: all of them, or the first `size` in a fixed hash order."""
    targets, _ = word_lists()
    if size is None:
        return targets
    if not 1 <= size <= len(targets):
        raise ValueError(f"wordle pool={size}: choose 1..{len(targets)} (None: every answer word)")
    order = sorted(targets, key=lambda w: hashlib.sha256(f"pool:{w}".encode()).hexdigest())
    return tuple(sorted(order[:size]))


def consistent(words: tuple[str, ...], history: list[tuple[str, str]]) -> list[str]:
    """The words that would have given every (guess, marks) feedback in `history`."""
    return [w for w in words if all(score_guess(g, w) == m for g, m in history)]


def listed_words(feedback: str) -> list[str] | None:
    """The words a `hint` line of the feedback lists (None when it has none)."""
    found = _LISTED_RE.search(feedback)
    return found.group(1).split(", ") if found else None


def split_of(word: str) -> str:
    """`eval` when a hash of the word falls in the eval bucket, else `train`."""
    return hash_split(f"wordle:{word}")


def score_guess(guess: str, target: str) -> str:
    """Per-letter feedback (`G`, `Y`, `-`) for a five-letter guess, duplicates handled as Wordle does."""
    marks = ["-"] * len(guess)
    unmatched: dict[str, int] = {}
    for i, (g, t) in enumerate(zip(guess, target, strict=True)):
        if g == t:
            marks[i] = "G"
        else:
            unmatched[t] = unmatched.get(t, 0) + 1
    for i, g in enumerate(guess):
        if marks[i] != "G" and unmatched.get(g, 0) > 0:
            marks[i] = "Y"
            unmatched[g] -= 1
    return "".join(marks)


def parse_guess(text: str) -> str | None:
    """The last `<guess>...</guess>` in a reply, lower-cased (None when there is none)."""
    found = _GUESS_RE.findall(text)
    return found[-1].strip().lower() if found else None


def judge(text: str, target: str, valid: frozenset[str]) -> tuple[str | None, str]:
    """(feedback marks or None when invalid, message for the model) for one reply."""
    guess = parse_guess(text)
    if guess is None:
        return None, "No guess found. Write exactly one guess in tags, like <guess>crane</guess>."
    if len(guess) != 5 or not guess.isalpha():
        return None, f"{guess!r} is not a five-letter word."
    if guess not in valid:
        return None, f"{guess!r} is not in the word list."
    marks = score_guess(guess, target)
    return marks, f"{guess.upper()} {' '.join(marks)}"


def guesses_of(episode: looprl.EpisodeResult) -> list[str | None]:
    """Feedback marks of each assistant turn (None for an invalid guess), replayed from the messages."""
    _, valid = word_lists()
    target = episode.task.answer or ""
    return [
        judge(looprl.answer_text(m), target, valid)[0]
        for m in episode.messages
        if m.role == "assistant"
    ][:MAX_GUESSES]


def win(episode: looprl.EpisodeResult) -> float:
    """1.0 when some guess was the secret word (the main reward)."""
    return float("GGGGG" in guesses_of(episode))


def partial_credit(episode: looprl.EpisodeResult) -> float:
    """Best guess's feedback: (greens + yellows / 2) / 5, in [0, 1] (small-weight shaping)."""
    marks = [m for m in guesses_of(episode) if m is not None]
    return max((m.count("G") + 0.5 * m.count("Y")) / 5 for m in marks) if marks else 0.0


def fewer_guesses(episode: looprl.EpisodeResult) -> float:
    """After a win: (7 - guesses used) / 6, so 1.0 for one guess and 1/6 for six; 0.0 without a win."""
    marks = guesses_of(episode)
    if "GGGGG" not in marks:
        return 0.0
    return (MAX_GUESSES + 1 - (marks.index("GGGGG") + 1)) / MAX_GUESSES


def invalid_guesses(episode: looprl.EpisodeResult) -> float:
    """Number of replies without a valid guess (metric)."""
    return float(sum(m is None for m in guesses_of(episode)))


def num_guesses(episode: looprl.EpisodeResult) -> float:
    """Guesses used, valid or not (metric)."""
    return float(len(guesses_of(episode)))


class WordleEnv(looprl.MultiTurnEnv):
    """Wordle as a multi-turn environment: feedback after each guess, at most six guesses."""

    pool: tuple[str, ...] = ()
    listed: int = 0  # the `hint=K` of load_environment: possible words each feedback lists

    async def setup_state(self, task: looprl.Task) -> dict[str, Any]:
        """The secret word and the feedback shown so far."""
        return {"task": task, "target": task.answer, "history": [], "marks": [], "won": False}

    def possible_words(self, marks: list[tuple[str, str]]) -> str:
        """The hint line: the first `listed` pool words consistent with the feedback so far."""
        left = consistent(self.pool, marks)
        more = f" (and {len(left) - self.listed} more)" if len(left) > self.listed else ""
        return f"Possible words: {', '.join(left[: self.listed])}{more}\n"

    async def env_response(
        self, messages: list[looprl.Message], state: dict[str, Any]
    ) -> list[looprl.Message]:
        """Judge the last guess; end the game on a win or after the sixth guess."""
        last = messages[-1]
        text = looprl.answer_text(last)
        marks, feedback = judge(text, state["target"], word_lists()[1])
        state["history"].append(feedback)
        if marks is not None:
            state["marks"].append((parse_guess(text), marks))
        if marks == "GGGGG":
            state["won"] = True
            return []  # an empty reply ends the episode
        left = MAX_GUESSES - len(state["history"])
        if left <= 0:
            return []
        plural = "es" if left > 1 else ""
        hint = self.possible_words(state["marks"]) if self.listed else ""
        return [
            looprl.Message(role="user", content=f"{feedback}\n{hint}{left} guess{plural} left.")
        ]


HINTED_WORDS = 8  # words a fading hint names, the secret among them


def candidates_hint(pool: tuple[str, ...]) -> looprl.HintFunction:
    """The fading hint (`[hints]` in training): before the first guess, eight words of the pool
    the secret is one of, in random order."""

    def hint(task: looprl.Task, rng: random.Random) -> looprl.Hint | None:
        if task.answer is None:
            return None
        others = rng.sample(
            [w for w in pool if w != task.answer], min(HINTED_WORDS - 1, len(pool) - 1)
        )
        words = rng.sample([task.answer, *others], len(others) + 1)
        return looprl.note_hint(f"The secret word is one of: {', '.join(words)}.")

    return hint


def make_tasks(split: str, n: int, seed: int, pool: int | None = None) -> list[looprl.Task]:
    """`n` games of a split with secret words drawn without replacement by `seed`."""
    words = [w for w in word_pool(pool) if split_of(w) == split]
    chosen = random.Random(f"wordle-{split}-{seed}").sample(words, min(n, len(words)))
    prompt = "Guess the secret word. You have 6 guesses."
    return [
        looprl.Task(
            id=f"wordle-{hashlib.sha256(w.encode()).hexdigest()[:10]}",
            prompt=[looprl.Message(role="user", content=prompt)],
            answer=w,
        )
        for w in chosen
    ]


def load_environment(
    max_tokens_per_turn: int = 128,
    max_context_tokens: int = 2048,
    pool: int | None = None,
    hint: int = 0,
    **kwargs: Any,
) -> WordleEnv:
    """The wordle environment (reward: win + 0.2 x partial credit + 0.2 x fewer-guesses bonus).

    `pool=N` plays with secrets from N fixed answer words; `hint=K` lists up to K of them still
    possible after each guess (both off by default: the full game). With `[hints]` a training
    game may start with eight candidate words named, the secret among them (`candidates_hint`)."""
    if hint < 0:
        raise ValueError(f"wordle hint={hint}: the number of possible words to show is 0 or more")
    rubric = looprl.Rubric(
        [win, partial_credit, fewer_guesses, invalid_guesses, num_guesses],
        weights=[1.0, 0.2, 0.2, 0.0, 0.0],
    )
    words = word_pool(pool)
    if pool is not None:
        kwargs.setdefault(
            "system_prompt", f"{SYSTEM_PROMPT} The secret word is one of {pool} words."
        )
    env = WordleEnv(
        name="wordle",
        rubric=rubric,
        train_tasks=lambda n, seed: make_tasks("train", n, seed, pool),
        eval_tasks=lambda n, seed: make_tasks("eval", n, seed, pool),
        limits=looprl.Limits(
            max_turns=MAX_GUESSES,
            max_tokens_per_turn=max_tokens_per_turn,
            max_context_tokens=max_context_tokens,
        ),
        system_prompt=kwargs.pop("system_prompt", SYSTEM_PROMPT),
        **kwargs,
    )
    env.pool, env.listed = words, hint
    env.hint_function = candidates_hint(words)
    return env
