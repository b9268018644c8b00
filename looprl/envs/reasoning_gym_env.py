"""The reasoning_gym environment: any dataset of the `reasoning-gym` package as a single-turn env.

`load_environment(dataset="leg_counting", size=1000, seed=0, **dataset_kwargs)` builds the
package's procedural dataset (`reasoning_gym.create_dataset(dataset, size=size, seed=seed,
**dataset_kwargs)`) and serves its items as tasks. The model answers inside
`<answer>...</answer>`; the package's own `score_answer` scores the extracted answer, so tasks
and rewards come from code nobody here wrote and training and evaluation cannot drift apart.

Items are generated lazily by index. The `size` items are split by a hash of the question text,
one in five to eval, so the two splits never share a question (items whose question repeats
land in the same split). Every task records its dataset index in `info["index"]`, from which
the entry that `score_answer` needs is regenerated when scoring.
"""

from __future__ import annotations

import hashlib
import random
import re
from typing import Any

import looprl
from looprl import split_of as hash_split

SYSTEM_PROMPT = (
    "Solve the problem. You may think first, then give only the final answer inside tags, "
    "like <answer>42</answer>. Follow any answer format the problem asks for."
)
ANSWER_HINT = "Hint: the answer is {answer}. End your reply with <answer>{answer}</answer>."
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)


def extract_answer(text: str) -> str | None:
    """The stripped content of the last `<answer>...</answer>` in a reply (None when absent)."""
    found = _ANSWER_RE.findall(text)
    return str(found[-1]).strip() if found else None


def split_of(question: str) -> str:
    """`eval` when a hash of the question falls in the eval bucket, else `train`."""
    return hash_split(question)


class ReasoningGymTasks:
    """Lazily generated, split, cached items of one reasoning-gym dataset, and their scoring."""

    def __init__(self, dataset: str, size: int, seed: int, dataset_kwargs: dict[str, Any]) -> None:
        import reasoning_gym  # imported here: the package loads ~100 generators (a few seconds)

        if dataset not in reasoning_gym.factory.DATASETS:
            names = sorted(reasoning_gym.factory.DATASETS)
            raise ValueError(f"unknown reasoning-gym dataset {dataset!r}; choose one of {names}")
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.name = dataset
        self.data = reasoning_gym.create_dataset(dataset, size=size, seed=seed, **dataset_kwargs)
        self.size = size
        self._entries: dict[int, dict[str, Any]] = {}

    def entry(self, index: int) -> dict[str, Any]:
        """The dataset item at `index` (question, answer, metadata), generated once."""
        if not 0 <= index < self.size:
            raise IndexError(f"{self.name} has {self.size} items; index {index} is out of range")
        if index not in self._entries:
            self._entries[index] = dict(self.data[index])
        return self._entries[index]

    def tasks(self, split: str, n: int, seed: int) -> list[looprl.Task]:
        """Up to `n` distinct tasks of a split, visiting the dataset in an order drawn by `seed`."""
        order = list(range(self.size))
        random.Random(f"reasoning_gym-{self.name}-{split}-{seed}").shuffle(order)
        out: list[looprl.Task] = []
        seen: set[str] = set()
        for index in order:
            question = str(self.entry(index)["question"])
            if split_of(question) != split or question in seen:
                continue
            seen.add(question)
            out.append(self._task(index, question))
            if len(out) >= n:
                break
        return out

    def _task(self, index: int, question: str) -> looprl.Task:
        digest = hashlib.sha256(f"{self.name}|{question}".encode()).hexdigest()[:12]
        return looprl.Task(
            id=f"rg-{self.name}-{digest}",
            prompt=[looprl.Message(role="user", content=question)],
            answer=str(self.entry(index)["answer"]),
            info={"dataset": self.name, "index": index},
        )

    def score(self, episode: looprl.EpisodeResult) -> float:
        """reasoning-gym's own `score_answer` on the extracted `<answer>` (None when missing)."""
        entry = self.entry(int(episode.task.info["index"]))
        return float(
            self.data.score_answer(extract_answer(looprl.final_answer_text(episode)), entry)
        )


def answer_format(episode: looprl.EpisodeResult) -> float:
    """1.0 when the final reply holds an `<answer>...</answer>` block (metric)."""
    return float(extract_answer(looprl.final_answer_text(episode)) is not None)


def load_environment(
    dataset: str = "leg_counting",
    size: int = 1000,
    seed: int = 0,
    max_tokens_per_turn: int = 256,
    max_context_tokens: int = 2048,
    system_prompt: str = SYSTEM_PROMPT,
    hint_style: str | None = None,
    **dataset_kwargs: Any,
) -> looprl.SingleTurnEnv:
    """A reasoning-gym dataset as a single-turn environment (reward: the package's `score_answer`).

    Extra keyword arguments go to the dataset's config, e.g. `min_animals=2` for leg_counting.
    `hint_style="answer"`: a training task's hint is its answer in a note (`ANSWER_HINT`), for
    `looprl bootstrap`'s rationalisation only (RL would reward copying it); default none.
    """
    if hint_style not in (None, "answer"):
        raise ValueError(
            f"reasoning_gym hint_style={hint_style!r}: choose 'answer' or leave it out"
        )
    source = ReasoningGymTasks(dataset, size, seed, dataset_kwargs)

    def score(episode: looprl.EpisodeResult) -> float:
        """reasoning-gym's own score of the `<answer>` (the reward)."""
        return source.score(episode)

    return looprl.SingleTurnEnv(
        name=f"reasoning_gym.{dataset}",
        rubric=looprl.Rubric([score, answer_format], weights=[1.0, 0.0]),
        train_tasks=lambda n, s: source.tasks("train", n, s),
        eval_tasks=lambda n, s: source.tasks("eval", n, s),
        limits=looprl.Limits(
            max_turns=1,
            max_tokens_per_turn=max_tokens_per_turn,
            max_context_tokens=max_context_tokens,
        ),
        system_prompt=system_prompt,
        hint=looprl.answer_note(ANSWER_HINT) if hint_style == "answer" else None,
    )
