"""The search_qa environment: multi-hop question answering with `search` and `read` tools over BM25.

The default corpus is a synthetic encyclopedia of a fictional world (`looprl.envs.corpus`), so
answers must be looked up; 1-hop questions need one page, 2-hop questions need two. Users can
pass their own corpus (JSONL of `{"id", "title", "text"}`) and questions (JSONL of
`{"question", "answer"}`, optionally `"gold_doc_ids"`, `"split"` and `"id"`).

The BM25 index (bm25s) is built once per corpus and cached under `$LOOPRL_CACHE/bm25/<hash>`
(default `~/.cache/looprl`); the hash covers every document, so an edited corpus gets a new
index. Reward: SQuAD-style normalized exact match of the `<answer>` (the evaluation metric
itself); metrics: token F1, searches per episode, and the fraction of gold pages read.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import random
import re
import shutil
import string
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bm25s

import looprl
from looprl.envs.corpus import Document, Question, generate_world, split_of

SYSTEM_PROMPT = (
    "Answer questions about a fictional world using the search and read tools; your own "
    "knowledge will not help. Search for the names in the question, read the pages you need, "
    "then reply with the answer alone inside tags, e.g. <answer>Luvar</answer>."
)
SNIPPET_CHARS = 80
MAX_K = 10


class BM25Index:
    """A BM25 index over documents (bm25s, English stopwords, no stemming), cached on disk."""

    def __init__(self, documents: list[Document], cache_dir: Path | None = None) -> None:
        if not documents:
            raise ValueError("the corpus has no documents; give at least one {id, title, text} row")
        self.documents = documents
        self.by_id = {d.id: d for d in documents}
        if len(self.by_id) != len(documents):
            raise ValueError("document ids must be unique; the corpus repeats an id")
        self.path = (cache_dir or default_cache_dir()) / "bm25" / corpus_hash(documents)
        self.retriever = self._load_or_build()
        self._lock = threading.Lock()  # tools run in a thread pool

    def _load_or_build(self) -> bm25s.BM25:
        if (self.path / "params.index.json").exists():
            return bm25s.BM25.load(str(self.path), show_progress=False)
        retriever = bm25s.BM25()
        tokens = bm25s.tokenize(
            [f"{d.title}\n{d.text}" for d in self.documents], stopwords="en", show_progress=False
        )
        retriever.index(tokens, show_progress=False)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".bm25-", dir=self.path.parent))
        try:
            retriever.save(str(tmp), show_progress=False)
            try:
                tmp.rename(self.path)
            except OSError:
                if not self.path.exists():  # not a lost race with another process
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return retriever

    def search(self, query: str, k: int = 5) -> list[tuple[Document, float]]:
        """The top `k` documents with a positive BM25 score for `query`, best first."""
        tokens = bm25s.tokenize([query], stopwords="en", return_ids=False, show_progress=False)
        if not tokens[0]:
            return []
        with self._lock:
            ids, scores = self.retriever.retrieve(
                tokens, k=min(k, len(self.documents)), show_progress=False
            )
        return [
            (self.documents[int(i)], float(s))
            for i, s in zip(ids[0], scores[0], strict=True)
            if s > 0
        ]


def default_cache_dir() -> Path:
    """`$LOOPRL_CACHE` when set, else `~/.cache/looprl`."""
    env = os.environ.get("LOOPRL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "looprl"


def corpus_hash(documents: list[Document]) -> str:
    """A short hash of every document and the index settings (keys the on-disk cache)."""
    h = hashlib.sha256(f"bm25s-{bm25s.__version__}-en-nostem".encode())
    for d in documents:
        h.update(json.dumps([d.id, d.title, d.text]).encode())
    return h.hexdigest()[:16]


def make_tools(index: BM25Index) -> list[Callable[..., str]]:
    """The `search` and `read` tools bound to an index."""

    def search(query: str, k: int = 5) -> str:
        """Search the encyclopedia; returns matching page ids, titles and the start of each page.

        Args:
            query: Words to look for, e.g. a name from the question.
            k: How many results to return (1-10).
        """
        if not 1 <= k <= MAX_K:
            raise ValueError(f"k must be between 1 and {MAX_K}, got {k}")
        hits = index.search(query, k)
        if not hits:
            return f"No pages match {query!r}. Try other words, such as a name from the question."
        return "\n".join(f"[{d.id}] {d.title}: {_snippet(d.text)}" for d, _ in hits)

    def read(doc_id: str) -> str:
        """Read a whole encyclopedia page.

        Args:
            doc_id: A page id from the search results, e.g. "doc0042".
        """
        doc = index.by_id.get(doc_id.strip().strip("[]"))
        if doc is None:
            raise ValueError(
                f"no page with id {doc_id!r}; use an id shown by search, e.g. {index.documents[0].id!r}"
            )
        return f"{doc.title}\n{doc.text}"

    return [search, read]


def _snippet(text: str) -> str:
    return text if len(text) <= SNIPPET_CHARS else text[:SNIPPET_CHARS].rsplit(" ", 1)[0] + " ..."


# --- answers and rewards -------------------------------------------------------------------

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_ANSWER_IS = re.compile(r"answer is:?\s*(.+?)\s*(?:\.\s*$|\.\s+|\n|$)", re.IGNORECASE)


def extract_answer(text: str) -> str | None:
    """The last `<answer>...</answer>` in a reply, else the text after 'the answer is'."""
    tags = _ANSWER_TAG.findall(text)
    if tags:
        return str(tags[-1]).strip()
    match = _ANSWER_IS.search(text)
    return match.group(1).strip() if match else None


def normalize_answer(text: str) -> str:
    """SQuAD normalization: lower case, no punctuation, no articles (a, an, the), single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def f1_score(prediction: str, reference: str) -> float:
    """SQuAD token F1 between normalized prediction and reference."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(reference).split()
    common = sum((collections.Counter(pred) & collections.Counter(ref)).values())
    if not pred or not ref or common == 0:
        return float(pred == ref)
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def exact_match(episode: looprl.EpisodeResult) -> float:
    """1.0 when the final answer equals the reference after normalization (the reward)."""
    got = extract_answer(looprl.final_answer_text(episode))
    ref = episode.task.answer
    return float(
        got is not None and ref is not None and normalize_answer(got) == normalize_answer(ref)
    )


def f1(episode: looprl.EpisodeResult) -> float:
    """Token F1 of the final answer against the reference (metric; 0.0 without an answer)."""
    got = extract_answer(looprl.final_answer_text(episode))
    return f1_score(got, episode.task.answer or "") if got is not None else 0.0


def searches(episode: looprl.EpisodeResult) -> float:
    """Number of `search` calls in the episode (metric)."""
    return float(len(looprl.tool_calls(episode, "search")))


def gold_read(episode: looprl.EpisodeResult) -> float:
    """Fraction of the gold pages the model opened with `read` (metric; 0.0 when none are known)."""
    gold = set(episode.task.info.get("gold_doc_ids") or [])
    if not gold:
        return 0.0
    opened = {
        str(c.arguments.get("doc_id", "")).strip().strip("[]")
        for c in looprl.tool_calls(episode, "read")
    }
    return len(gold & opened) / len(gold)


def first_hop_hint(read: Callable[[str], str]) -> looprl.HintFunction:
    """The hint of a 2-hop question: its first page already opened with `read` (the model still
    has to find the second); 1-hop questions get none."""

    def hint(task: looprl.Task, rng: random.Random) -> looprl.Hint | None:
        gold = task.info.get("gold_doc_ids") or []
        if len(gold) < 2:
            return None
        return looprl.tool_call_hint("read", {"doc_id": gold[0]}, read(gold[0]))

    return hint


# --- tasks ---------------------------------------------------------------------------------


def _read_jsonl(path: str | Path, required: tuple[str, ...]) -> list[dict[str, Any]]:
    rows = []
    for n, row in looprl.iter_jsonl(path, fix=f"each line must be an object with {list(required)}"):
        missing = [k for k in required if k not in row]
        if missing:
            raise ValueError(
                f"{path}:{n}: missing field(s) {missing}; each row needs {list(required)}"
            )
        rows.append(row)
    return rows


def load_corpus(path: str | Path) -> list[Document]:
    """Documents from a JSONL file of `{"id", "title", "text"}` rows."""
    return [
        Document(str(r["id"]), str(r["title"]), str(r["text"]))
        for r in _read_jsonl(path, ("id", "title", "text"))
    ]


def load_questions(path: str | Path) -> list[Question]:
    """Questions from a JSONL file of `{"question", "answer"}` rows.

    Optional fields: `gold_doc_ids` (list of page ids), `split` (`train`/`eval`; default: a hash
    of the question text decides, one in five to eval), `id`.
    """
    out = []
    for r in _read_jsonl(path, ("question", "answer")):
        q = str(r["question"])
        split = r.get("split", split_of(q))
        if split not in ("train", "eval"):
            raise ValueError(f"{path}: question {q!r} has split {split!r}; use 'train' or 'eval'")
        gold = tuple(str(g) for g in r.get("gold_doc_ids") or ())
        qid = str(r.get("id") or f"sqa-{hashlib.sha256(q.encode()).hexdigest()[:12]}")
        out.append(Question(qid, q, str(r["answer"]), gold, split, max(1, len(gold)), "user"))
    return out


def make_tasks(questions: list[Question], split: str, hops: int | None = None) -> list[looprl.Task]:
    """Tasks of one split (optionally only `hops`-hop questions), in a stable mixed order; the
    number of hops is each task's `info["difficulty"]` (the curriculum's levels)."""
    chosen = [q for q in questions if q.split == split and (hops is None or q.hops == hops)]
    chosen.sort(key=lambda q: q.id)  # ids are hashes: a stable order that mixes kinds
    return [
        looprl.Task(
            id=q.id,
            prompt=[looprl.Message(role="user", content=q.question)],
            answer=q.answer,
            info={
                "gold_doc_ids": list(q.gold_doc_ids),
                "hops": q.hops,
                "difficulty": q.hops,
                "kind": q.kind,
            },  # fmt: skip
        )
        for q in chosen
    ]


def load_environment(
    corpus_path: str | None = None,
    questions_path: str | None = None,
    *,
    world_seed: int = 0,
    hops: int | None = None,
    cache_dir: str | None = None,
    max_turns: int = 6,
    max_tokens_per_turn: int = 128,
    max_context_tokens: int = 2048,
    **kwargs: Any,
) -> looprl.ToolEnv:
    """The search_qa environment over the synthetic world (or your corpus and questions).

    `world_seed` picks the synthetic world; `hops` keeps only 1- or 2-hop questions; `cache_dir`
    overrides where the BM25 index is cached. A 2-hop training question may be hinted with its
    first page already read (`first_hop_hint`).
    """
    if corpus_path is not None and questions_path is None:
        raise ValueError(
            "a custom corpus_path needs questions_path too (JSONL of {question, answer})"
        )
    world = generate_world(world_seed)  # a few milliseconds; supplies whatever the user did not
    documents = load_corpus(corpus_path) if corpus_path is not None else world.documents
    questions = load_questions(questions_path) if questions_path is not None else world.questions
    if hops not in (None, 1, 2):
        raise ValueError(f"hops must be 1, 2 or None (both), got {hops!r}")
    index = BM25Index(documents, Path(cache_dir) if cache_dir else None)
    rubric = looprl.Rubric([exact_match, f1, searches, gold_read], weights=[1.0, 0.0, 0.0, 0.0])
    tools = make_tools(index)
    return looprl.ToolEnv(
        name="search_qa",
        tools=tools,
        rubric=rubric,
        train_tasks=make_tasks(questions, "train", hops),
        eval_tasks=make_tasks(questions, "eval", hops),
        limits=looprl.Limits(
            max_turns=max_turns,
            max_tokens_per_turn=max_tokens_per_turn,
            max_context_tokens=max_context_tokens,
        ),
        system_prompt=kwargs.pop("system_prompt", SYSTEM_PROMPT),
        hint=kwargs.pop("hint", first_hop_hint(tools[1])),
        **kwargs,
    )
