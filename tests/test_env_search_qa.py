"""search_qa: the synthetic world, BM25 index cache, tools, rewards and scripted episodes."""

from __future__ import annotations

import json

import bm25s
import pytest
from helpers import check_token_invariants, run_episode

from looprl.envs.base import Environment
from looprl.envs.corpus import generate_world
from looprl.envs.search_qa import (
    BM25Index,
    exact_match,
    extract_answer,
    f1,
    f1_score,
    gold_read,
    load_environment,
    make_tools,
    normalize_answer,
    searches,
)
from looprl.types import EpisodeResult, Message, Task, ToolCall


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Environment:
    return load_environment(cache_dir=str(tmp_path_factory.mktemp("cache")))


def _call(name: str, **arguments: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def _two_hop_task(env: Environment) -> Task:
    return next(t for t in env.get_tasks("eval", None) if t.info["hops"] == 2)


def test_world_is_deterministic_answerable_and_split_by_subject():
    world = generate_world(0)
    assert world == generate_world(0)
    assert world.documents != generate_world(1).documents
    pages = {d.id: d.text for d in world.documents}
    for q in world.questions:
        assert q.answer in " ".join(pages[g] for g in q.gold_doc_ids)
        assert q.answer in pages[q.gold_doc_ids[-1]]  # the last hop holds the answer
        assert len(q.gold_doc_ids) == q.hops
    train = [q for q in world.questions if q.split == "train"]
    test = [q for q in world.questions if q.split == "eval"]
    assert len(test) > 50 and len(train) > 4 * 50
    assert not {q.question for q in train} & {q.question for q in test}
    assert not {q.gold_doc_ids[0] for q in train} & {q.gold_doc_ids[0] for q in test}  # subjects
    assert {q.hops for q in test} == {1, 2}


def test_index_is_cached_by_corpus_hash(tmp_path, monkeypatch):
    docs = generate_world(0).documents
    first = BM25Index(docs, tmp_path)
    assert (first.path / "params.index.json").exists()

    def no_rebuild(*args: object, **kwargs: object) -> None:
        raise AssertionError("the cached index should have been loaded")

    monkeypatch.setattr(bm25s.BM25, "index", no_rebuild)
    second = BM25Index(docs, tmp_path)
    assert second.path == first.path
    assert [d.id for d, _ in second.search(docs[3].title, 3)] == [
        d.id for d, _ in first.search(docs[3].title, 3)
    ]
    monkeypatch.undo()
    assert BM25Index(docs[:-1], tmp_path).path != first.path


def test_tools_search_and_read(tmp_path):
    world = generate_world(0)
    search, read = make_tools(BM25Index(world.documents, tmp_path))
    q = next(q for q in world.questions if q.kind == "birth_city")
    name = q.question.removeprefix("In which city was ").removesuffix(" born?")
    assert search(name, 1).startswith(f"[{q.gold_doc_ids[0]}] {name}:")
    assert len(search(name).splitlines()) <= 5
    assert "No pages match" in search("zzzz qqqq")
    assert q.answer in read(q.gold_doc_ids[0]) and read(f"[{q.gold_doc_ids[0]}]") == read(
        q.gold_doc_ids[0]
    )
    with pytest.raises(ValueError, match="no page with id"):
        read("doc9999")
    with pytest.raises(ValueError, match="k must be between"):
        search(name, 0)


def _ep(
    reply: str, calls: list[ToolCall] | None = None, gold: list[str] | None = None
) -> EpisodeResult:
    task = Task(
        id="t",
        prompt=[Message(role="user", content="q")],
        answer="Sufir Paeben",
        info={"gold_doc_ids": gold or []},
    )
    msgs = [
        *task.prompt,
        Message(role="assistant", tool_calls=calls or []),
        Message(role="assistant", content=reply),
    ]
    return EpisodeResult(task=task, messages=msgs)


def test_answer_normalization_and_rewards():
    assert normalize_answer("  The Sufir,  PAEBEN! ") == "sufir paeben"
    assert extract_answer("x <answer>a</answer> then <answer> b </answer>") == "b"
    assert extract_answer("So the answer is Luvar.") == "Luvar"
    assert extract_answer("Luvar") is None
    assert f1_score("Sufir", "Sufir Paeben") == pytest.approx(2 / 3)
    assert exact_match(_ep("<answer>the sufir paeben.</answer>")) == 1.0
    assert exact_match(_ep("<answer>Sufir</answer>")) == 0.0 and f1(
        _ep("<answer>Sufir</answer>")
    ) == pytest.approx(2 / 3)
    assert exact_match(_ep("Sufir Paeben")) == 0.0 and f1(_ep("no tags")) == 0.0
    calls = [
        ToolCall("search", {"query": "x"}),
        ToolCall("search", {"query": "y"}),
        ToolCall("read", {"doc_id": "doc0001"}),
    ]
    assert searches(_ep("", calls)) == 2.0
    assert gold_read(_ep("", calls, gold=["doc0001", "doc0002"])) == 0.5
    assert gold_read(_ep("", calls)) == 0.0


async def test_two_hop_success_and_wrong_answer(env):
    task = _two_hop_task(env)
    gold = task.info["gold_doc_ids"]
    subject = task.prompt[-1].content.rstrip("?").split(" the ")[-1]
    steps = [
        _call("search", query=subject, k=3),
        _call("read", doc_id=gold[0]),
        _call("read", doc_id=gold[1]),
    ]
    ep = await run_episode(env, task, [*steps, f"<answer>{task.answer}</answer>"])
    assert ep.reward == 1.0 and ep.rewards["gold_read"] == 1.0 and ep.rewards["searches"] == 1.0
    assert ep.num_tool_calls == 3 and not ep.tool_errors and ep.stop_reason == "done"
    assert task.answer in ep.messages[-2].content  # the second page held the answer
    wrong = await run_episode(env, task, [*steps, "<answer>Atlantis</answer>"])
    assert wrong.reward == 0.0 and wrong.rewards["f1"] == 0.0


async def test_malformed_calls_are_answered_and_counted(env):
    task = env.get_tasks("eval", 1)[0]
    script = [
        '<tool_call>{"name": "search", "arguments": {"query": </tool_call>',
        _call("browse", url="x")
        + _call("read", doc_id="doc9999")
        + _call("search", query="x", k=50),
        f"<answer>{task.answer}</answer>",
    ]
    ep = await run_episode(env, task, script)
    assert ep.tool_errors == {"malformed_json": 1, "unknown_tool": 1, "exception": 2}
    assert ep.num_tool_calls == 4 and ep.reward == 1.0 and not ep.errors
    tool_msgs = [m.content for m in ep.messages if m.role == "tool"]
    assert any("no page with id 'doc9999'" in c for c in tool_msgs) and any(
        "unknown tool" in c for c in tool_msgs
    )


async def test_max_turns_truncates(env):
    task = env.get_tasks("eval", 1)[0]
    ep = await run_episode(env, task, [_call("search", query="Listand")] * 10)
    assert ep.truncated and ep.stop_reason == "max_turns" and ep.num_turns == env.limits.max_turns
    assert ep.reward == 0.0 and ep.rewards["searches"] == env.limits.max_turns


async def test_token_level_masks(env, tiny_tokenizer):
    task = _two_hop_task(env)
    gold = task.info["gold_doc_ids"]
    script = [_call("search", query="founder", k=2), "<tool_call>oops</tool_call>", _call("read", doc_id=gold[0]), f"<answer>{task.answer}</answer>"]  # fmt: skip
    ep = await run_episode(env, task, script, tiny_tokenizer)
    check_token_invariants(ep, env, tiny_tokenizer)
    assert ep.reward == 1.0 and ep.tool_errors == {"malformed_json": 1}


def test_user_corpus_and_questions(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    rows = [
        {"id": "a", "title": "Zorblat", "text": "Zorblat is a purple fruit."},
        {"id": "b", "title": "Quem", "text": "Quem is a river."},
    ]
    corpus.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    questions = tmp_path / "questions.jsonl"
    qs = [{"question": "What colour is Zorblat?", "answer": "purple", "gold_doc_ids": ["a"], "split": "eval"},
          {"question": "What is Quem?", "answer": "a river", "split": "train"}]  # fmt: skip
    questions.write_text("\n".join(json.dumps(q) for q in qs))
    env = load_environment(str(corpus), str(questions), cache_dir=str(tmp_path / "cache"))
    (task,) = env.get_tasks("eval", None)
    assert task.answer == "purple" and task.info["gold_doc_ids"] == ["a"]
    assert [t.answer for t in env.get_tasks("train", None)] == ["a river"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "no title"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: missing field\(s\) \['title'\]"):
        load_environment(str(bad), str(questions), cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="needs questions_path"):
        load_environment(str(corpus))
