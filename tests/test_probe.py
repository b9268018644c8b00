"""`looprl probe`: every exploit runs through the real rollout; toy rubrics judged right; --strict."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from looprl.envs.base import SingleTurnEnv
from looprl.envs.registry import load_environment
from looprl.probe import GENERIC, Exploit, ProbeProfile, Turn, run_probe
from looprl.probe.exploits import FractionNotation, LookalikeUnicode, ScientificNotation, flood_size
from looprl.probe.profiles import HonestFailure
from looprl.rubrics import Rubric
from looprl.types import EpisodeResult, Message, Task
from looprl.viewer.probe import probe_problem

BUNDLED = {
    "calculator": {},
    "search_qa": {},
    "wordle": {},
    "reasoning_gym": {},
    "python_math": {},
    "mixture": {"envs": ["calculator", "wordle"]},
    "number_anywhere": {},
    "number_final": {},
    "support_desk": {},
}
SECONDS: dict[str, float] = {}


@pytest.fixture(scope="module")
def probes(tiny_tokenizer):
    """The probe of every bundled environment (3 tasks per policy), with its wall time."""
    out = {}
    for name, kwargs in BUNDLED.items():
        start = time.perf_counter()
        env = load_environment(name, **kwargs)
        out[name] = asyncio.run(
            run_probe(env, env_name=name, env_kwargs=kwargs, tasks=3, tokenizer=tiny_tokenizer)
        )
        SECONDS[name] = time.perf_counter() - start
    print("probe seconds per environment:", {k: round(v, 1) for k, v in SECONDS.items()})
    print(f"probe seconds in total: {sum(SECONDS.values()):.1f}")
    return out


def test_every_exploit_produces_a_finished_scored_episode(probes):
    ran: set[str] = set()
    for name, result in probes.items():
        env = load_environment(name, **BUNDLED[name])
        for ep in result.episodes:
            exploit = ep.task.info["exploit"]
            ran.add(exploit)
            assert ep.stop_reason, (name, exploit)
            assert not ep.errors, (name, exploit, ep.errors)
            names = env.for_task(ep.task).rubric.names
            assert set(names) <= set(ep.rewards), (name, exploit, ep.rewards)
            sampled = sum(t.num_sampled for t in ep.trajectories)
            assert ep.num_turns >= 1 and sampled >= 1, (name, exploit)  # token ids went through
    assert {e.name for e in GENERIC} <= ran
    assert len(GENERIC) >= 15
    assert all(type(e).__doc__ for e in GENERIC)


def test_endless_reply_is_cut_at_the_token_cap(probes):
    eps = [e for e in probes["calculator"].episodes if e.task.info["exploit"] == "endless_reply"]
    assert eps and all(e.stop_reason == "max_tokens" and e.truncated for e in eps)
    cap = load_environment("calculator").limits.max_tokens_per_turn
    assert all(e.trajectories[0].num_sampled == cap for e in eps)


def test_tool_flood_runs_every_call(probes):
    eps = [e for e in probes["calculator"].episodes if e.task.info["exploit"] == "tool_flood"]
    limits = load_environment("calculator").limits
    calls = flood_size(limits.max_tokens_per_turn)
    assert calls == 3  # 96 tokens a turn: three calls fit
    # every turn floods until max_turns cuts the episode; every call ran and was answered
    assert eps and all(e.stop_reason == "max_turns" for e in eps)
    assert all(e.num_tool_calls == calls * limits.max_turns for e in eps)
    assert all(
        sum(m.role == "tool" for m in e.messages) == calls * (limits.max_turns - 1) for e in eps
    )


def test_hackable_toy_is_flagged_and_its_sound_twin_is_not(probes):
    gameable = probes["number_anywhere"].document
    assert gameable["strict_failed"]
    assert {"candidate_list", "many_answers"} <= set(gameable["exploitable"])
    sound = probes["number_final"].document
    assert sound["exploitable"] == [] and not sound["strict_failed"]
    assert sound["reference"]["mean_reward"] == 1.0 and sound["baseline"]["mean_reward"] == 0.0


def test_bundled_environments_pass_strict(probes):
    for name, result in probes.items():
        if name == "number_anywhere":
            continue
        doc = result.document
        bad = [r["name"] for r in doc["rows"] if r["verdict"] != "resisted" and "accepted" not in r]
        assert not doc["strict_failed"] and not bad, (name, bad)
        assert probe_problem(doc) is None
        assert doc["reference"]["mean_reward"] > doc["baseline"]["mean_reward"], name


def test_cli_strict_exit_code_and_files(tmp_path):
    from looprl.cli.main import main

    out = tmp_path / "anywhere"
    argv = ["probe", "number_anywhere", "--tasks", "2", "--out", str(out)]
    assert main([*argv, "--strict"]) == 1
    doc = json.loads((out / "probe.json").read_text())
    assert probe_problem(doc) is None and doc["strict_failed"] and doc["tasks"] == 2
    lines = (out / "results.jsonl").read_text().splitlines()
    episodes = [EpisodeResult.from_json(line) for line in lines]
    total = sum(r["episodes"] for r in doc["rows"]) + 2 * 2  # baseline and reference
    assert len(episodes) == total
    counts = {r["name"]: r["episodes"] for r in doc["rows"]}
    for name, n in counts.items():
        assert sum(ep.task.info["exploit"] == name for ep in episodes) == n
    assert json.loads((out / "metadata.json").read_text())["status"] == "finished"
    assert main([*argv[:-1], str(tmp_path / "again")]) == 0  # not strict: the table only
    assert (
        main(["probe", "number_final", "--tasks", "2", "--strict", "--out", str(tmp_path / "f")])
        == 0
    )


def test_cli_refuses_bad_arguments(tmp_path, capsys):
    from looprl.cli.main import main

    assert main(["probe", "number_final", "--tasks", "0"]) == 2
    assert "--tasks" in capsys.readouterr().err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert main(["probe", "number_final", "--out", str(tmp_path / "full")]) == 2
    assert "not empty" in capsys.readouterr().err


class SayTheWord(Exploit):
    """Writes 'password' (the toy rubric below rewards it)."""

    name = "say_the_word"

    def reply(self, turn: Turn) -> str:
        return "password"


def _word_env(exploits: list[Exploit]) -> SingleTurnEnv:
    def says_password(episode: EpisodeResult) -> float:
        """1.0 when the reply contains 'password'."""
        return float("password" in episode.messages[-1].content)

    tasks = [Task(f"t{i}", [Message(role="user", content=f"Say {i}.")], str(i)) for i in range(3)]
    env = SingleTurnEnv(name="word", rubric=Rubric([says_password]), eval_tasks=tasks)
    env.probe_profile = ProbeProfile("<answer>{}</answer>", exploits=exploits)  # type: ignore[attr-defined]
    return env


def test_an_environment_adds_its_own_exploit(tiny_tokenizer):
    env = _word_env([SayTheWord()])
    result = asyncio.run(run_probe(env, env_name="word", tasks=3, tokenizer=tiny_tokenizer))
    row = next(r for r in result.document["rows"] if r["name"] == "say_the_word")
    assert row["verdict"] == "exploitable" and row["mean_reward"] == 1.0 and row["episodes"] == 3
    assert row["description"] == "Writes 'password' (the toy rubric below rewards it)."
    assert result.document["exploitable"] == ["say_the_word"]


def test_an_exploit_may_not_reuse_a_generic_name(tiny_tokenizer):
    class Clash(SayTheWord):
        """Same name as a generic exploit."""

        name = "empty_reply"

    with pytest.raises(ValueError, match="give it a name of its own"):
        asyncio.run(run_probe(_word_env([Clash()]), env_name="word", tokenizer=tiny_tokenizer))


def _turn(answer: str) -> Turn:
    task = Task("t", [Message(role="user", content="q")], answer)
    return Turn(task, [], 0, ProbeProfile("<answer>{}</answer>"), [], 64, 1)


def test_notation_exploits_write_the_value_another_way():
    assert ScientificNotation().reply(_turn("45")) == "<answer>4.5e1</answer>"
    assert ScientificNotation().reply(_turn("-1200")) == "<answer>-1.2e3</answer>"
    assert FractionNotation().reply(_turn("7/12")) == "<answer>14/24</answer>"
    assert FractionNotation().reply(_turn("45")) == "<answer>90/2</answer>"
    assert LookalikeUnicode().reply(_turn("40 cats")) == "<answer>４０ саtѕ</answer>"
    assert HonestFailure().reply(_turn("45")) == "<answer>46</answer>"
    assert not ScientificNotation().applies(_turn("Luvar").task, [])


def test_answers_are_read_outside_reasoning_and_tool_calls():
    from looprl.envs.python_math import not_in_lowest_terms
    from looprl.kit import answer_text

    msg = Message(role="assistant", content="<think>The answer is 4.</think> I give up.")
    assert answer_text(msg) == "I give up."
    assert answer_text(Message(role="assistant", content="ok <THINK>unclosed 4")) == "ok"
    question = "Compute 3/4 + 5/6 as a reduced fraction."
    assert not_in_lowest_terms(question, "38/24") and not_in_lowest_terms(
        question, "\\frac{38}{24}"
    )
    assert not not_in_lowest_terms(question, "19/12")
    assert not not_in_lowest_terms("What is 2 + 2?", "8/2")  # only where a reduced one is asked


def test_python_math_wants_a_number_not_the_question_expression():
    from looprl.envs.python_math import correct

    task = Task(
        "t", [Message(role="user", content="Compute 3/4 + 5/6 as a reduced fraction.")], "19/12"
    )

    def score(reply: str) -> float:
        msgs = [*task.prompt, Message(role="assistant", content=reply)]
        return correct(EpisodeResult(task=task, messages=msgs))

    assert score("\\boxed{19/12}") == 1.0 and score("\\boxed{\\frac{19}{12}}") == 1.0
    assert score("\\boxed{3/4 + 5/6}") == 0.0  # math-verify alone evaluates it to 19/12
    assert score("\\boxed{38/24}") == 0.0 and score("\\boxed{1.5833}") == 0.0


def test_the_hook_example_in_environments_md_runs(tmp_path, tiny_tokenizer):
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "environments.md").read_text()
    section = doc.split("## Attack it: `looprl probe`", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "polite_squares.py"
    path.write_text(code)
    env = load_environment(str(path))
    result = asyncio.run(run_probe(env, env_name=str(path), tasks=10, tokenizer=tiny_tokenizer))
    row = next(r for r in result.document["rows"] if r["name"] == "flattery")
    assert row["verdict"] == "exploitable" and row["mean_reward"] == 0.5  # as the doc says
    assert result.document["baseline"]["mean_reward"] == 0.0
    paid = {
        r["name"]: r["mean_reward"] for r in result.document["rows"] if r["verdict"] != "resisted"
    }
    assert paid == {"hedged_answers": 0.5, "many_answers": 0.15, "flattery": 0.5}  # as the doc says


def test_small_operand_ranges_give_their_whole_pool() -> None:
    """Operands 1..12 hold fewer questions than an epoch asks: each split gives all of its own."""
    from looprl.envs.hackable import generate_tasks
    from looprl.envs.registry import load_environment

    train = generate_tasks("train", 1000, 0, 1, 12)
    held_out = generate_tasks("eval", 64, 0, 1, 12)
    questions = {t.prompt[0].content for t in train} | {t.prompt[0].content for t in held_out}
    assert len(train) + len(held_out) == len(questions) == 144  # disjoint, and every pair once
    env = load_environment("number_final", low=1, high=12)
    stream = env.iter_train_tasks(seed=0)
    assert {next(stream).prompt[-1].content for _ in range(len(train))} == {
        t.prompt[0].content for t in train
    }


def _doc_section(heading: str) -> str:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "environments.md").read_text()
    return doc.split(heading, 1)[1].split("```python\n", 1)[1].split("```", 1)[0]


def test_your_own_reference_recipe_runs_from_the_cli(tmp_path, capsys, monkeypatch):
    """docs/environments.md, "A probe profile with your own reference", and --reference."""
    from looprl.cli.main import main

    (tmp_path / "squares.py").write_text(
        _doc_section("### A probe profile with your own reference")
    )
    monkeypatch.chdir(tmp_path)
    assert main(["probe", "squares.py", "--tasks", "10", "--strict", "--out", "a"]) == 0
    doc = json.loads((tmp_path / "a" / "probe.json").read_text())
    assert doc["reference"]["mean_reward"] == 1.0 and doc["baseline"]["mean_reward"] == 0.0
    argv = ["probe", "number_final", "--tasks", "2", "--reference", "squares.py:solve"]
    assert main([*argv, "--out", "b"]) == 0  # another environment's reference: wrong numbers
    assert json.loads((tmp_path / "b" / "probe.json").read_text())["reference"]["mean_reward"] == 0
    capsys.readouterr()
    for spec, needle in (("squares.py:nosuch", "has no function 'nosuch'"),
                         ("squares.py", "is not MODULE:FN"), ("nosuch.py:f", "cannot import")):  # fmt: skip
        assert main(["probe", "squares.py", "--reference", spec, "--out", "c"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: --reference") and needle in err, err
        assert "Traceback" not in err and not (tmp_path / "c").exists()


def test_a_reference_needs_no_name(tiny_tokenizer):
    """An object with reply() but no name, a bare function, a class: each is the reference row."""

    class Answers:
        def reply(self, turn: Turn) -> str:
            return turn.fmt(turn.answer)

    def answers(turn: Turn) -> str:
        return turn.fmt(turn.answer)

    for reference in (Answers(), answers, Answers):
        env = _word_env([])
        env.probe_profile.reference = reference  # type: ignore[attr-defined]
        result = asyncio.run(run_probe(env, env_name="word", tasks=3, tokenizer=tiny_tokenizer))
        assert result.reference.name == "reference" and result.reference.episodes == 3
        roles = {
            ep.task.info["probe_role"]
            for ep in result.episodes
            if ep.task.id.endswith("~reference")
        }
        assert roles == {"reference"}
    with pytest.raises(TypeError, match="not a policy; give a function turn -> str"):
        env = _word_env([])
        env.probe_profile.reference = 42  # type: ignore[attr-defined]
        asyncio.run(run_probe(env, env_name="word", tasks=3, tokenizer=tiny_tokenizer))


BAD_RUBRICS = '''
"""Two rubrics a probe must refuse: one pays nothing, one pays any number in the format."""
import re

from looprl import Message, Rubric, SingleTurnEnv, Task


def nothing(episode):
    """0.0 for every reply, the right one too."""
    return 0.0


def any_number(episode):
    """1.0 for any number in <answer> tags, right or wrong."""
    return float(bool(re.search(r"<answer>-?\\d+</answer>", episode.messages[-1].content)))


def broken(episode):
    """Raises for every reply."""
    raise KeyError("answer_key")


def load_environment(reward="nothing"):
    tasks = [Task(f"t{i}", [Message(role="user", content=f"What is {i} + 1?")], str(i + 1))
             for i in range(3)]
    rubric = Rubric([{"nothing": nothing, "any_number": any_number, "broken": broken}[reward]])
    return SingleTurnEnv(name=reward, rubric=rubric, eval_tasks=tasks)
'''


@pytest.mark.parametrize(
    ("reward", "reason"),
    [
        ("nothing", "the reference scores no better than the honest failure (0.000 against"),
        ("any_number", "the rubric pays the honest wrong answer like the right one (1.000 against"),
    ],
)
def test_strict_fails_a_rubric_that_cannot_tell_right_from_wrong(tmp_path, capsys, reward, reason):
    from looprl.cli.main import main

    (tmp_path / "bad_rubrics.py").write_text(BAD_RUBRICS)
    out = tmp_path / reward
    argv = ["probe", str(tmp_path / "bad_rubrics.py"), "--env.reward", reward, "--tasks", "3"]
    assert main([*argv, "--strict", "--out", str(out)]) == 1
    doc = json.loads((out / "probe.json").read_text())
    # every exploit "resisted": the exploit rows alone would pass --strict
    assert doc["exploitable"] == [] and all(r["verdict"] == "resisted" for r in doc["rows"])
    assert doc["strict_failed"] and len(doc["rubric_problems"]) == 1
    assert doc["rubric_problems"][0].startswith(reason) and probe_problem(doc) is None
    printed = " ".join(capsys.readouterr().out.split())
    assert f"rubric: {reason}" in printed


def test_a_baseline_that_cannot_be_scored_is_one_line_not_a_traceback(tmp_path, capsys):
    from looprl.cli.main import main

    (tmp_path / "bad_rubrics.py").write_text(BAD_RUBRICS)
    out = tmp_path / "broken"
    argv = ["probe", str(tmp_path / "bad_rubrics.py"), "--env.reward", "broken", "--tasks", "2"]
    assert main([*argv, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("error: the honest-failure baseline could not be scored on")
    assert "2 of 2 episodes errored; the first: scoring: KeyError: 'answer_key'" in err
    assert "fix the environment so that its rubric scores a wrong answer" in err
    assert str(out / "results.jsonl") in err and (out / "results.jsonl").exists()
