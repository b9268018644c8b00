"""wordle: feedback with duplicate letters, guess parsing, rewards, splits and scripted games."""

from __future__ import annotations

import pytest
from helpers import check_token_invariants, run_episode

from looprl.envs.wordle import (
    consistent,
    fewer_guesses,
    invalid_guesses,
    judge,
    load_environment,
    make_tasks,
    parse_guess,
    partial_credit,
    score_guess,
    split_of,
    win,
    word_lists,
    word_pool,
)
from looprl.types import EpisodeResult, Message, Task


@pytest.mark.parametrize(
    ("guess", "target", "marks"),
    [
        ("crane", "crane", "GGGGG"),
        ("speed", "abide", "--Y-Y"),  # the second e has no partner left
        ("eerie", "there", "Y-Y-G"),  # green e uses one e, the first e takes the other
        ("lolly", "hello", "-YGG-"),  # two greens use both l's; the first l gets nothing
        ("hello", "lolly", "--GGY"),
        ("abbey", "babes", "YYGG-"),
        ("zzzzz", "crane", "-----"),
    ],
)
def test_feedback_handles_duplicate_letters(guess, target, marks):
    assert score_guess(guess, target) == marks


def test_word_lists_and_splits():
    targets, valid = word_lists()
    assert len(targets) > 2000 and set(targets) <= valid and all(len(w) == 5 for w in valid)
    train = {t.answer for s in range(3) for t in make_tasks("train", 500, s)}
    test = {t.answer for s in range(3) for t in make_tasks("eval", 500, s)}
    assert not train & test and len(test) > 300
    assert all(split_of(w) == "eval" for w in test)
    assert [t.answer for t in make_tasks("eval", 5, 1)] == [
        t.answer for t in make_tasks("eval", 5, 1)
    ]
    assert [t.answer for t in make_tasks("eval", 5, 1)] != [
        t.answer for t in make_tasks("eval", 5, 2)
    ]


def test_parse_and_judge():
    _, valid = word_lists()
    assert parse_guess("I think <guess> Crane </guess>, no: <guess>slate</guess>") == "slate"
    assert parse_guess("crane") is None
    assert judge("crane", "crane", valid) == (None, judge("", "crane", valid)[1])
    assert judge("<guess>cran</guess>", "crane", valid)[1] == "'cran' is not a five-letter word."
    assert judge("<guess>qxzvk</guess>", "crane", valid)[1] == "'qxzvk' is not in the word list."
    assert judge("<guess>react</guess>", "crane", valid) == ("YYGY-", "REACT Y Y G Y -")


def _ep(*replies: str, target: str = "crane") -> EpisodeResult:
    task = Task(id="w", prompt=[Message(role="user", content="go")], answer=target)
    msgs = [task.prompt[0]]
    for r in replies:
        msgs += [
            Message(role="assistant", content=r, raw=r),
            Message(role="user", content="feedback"),
        ]
    return EpisodeResult(task=task, messages=msgs)


def test_rewards_on_hand_made_games():
    first_try = _ep("<guess>crane</guess>")
    assert (win(first_try), fewer_guesses(first_try), partial_credit(first_try)) == (1.0, 1.0, 1.0)
    third = _ep("<guess>slate</guess>", "nonsense", "<guess>crane</guess>")
    assert (
        win(third) == 1.0
        and fewer_guesses(third) == pytest.approx(4 / 6)
        and invalid_guesses(third) == 1.0
    )
    lost = _ep("<guess>react</guess>", "<guess>zzzzz</guess>")
    assert win(lost) == 0.0 and fewer_guesses(lost) == 0.0
    assert partial_credit(lost) == pytest.approx((1 + 0.5 * 3) / 5)  # YYGY- is the best guess
    assert partial_credit(_ep("no guess")) == 0.0


async def test_win_after_feedback():
    env = load_environment()
    task = next(t for t in env.get_tasks("eval", 5) if t.answer != "slate")
    ep = await run_episode(env, task, ["<guess>slate</guess>", f"<guess>{task.answer}</guess>"])
    assert ep.stop_reason == "done" and not ep.truncated and ep.num_turns == 2
    assert ep.state["won"] and ep.rewards["win"] == 1.0
    assert ep.reward == pytest.approx(1.0 + 0.2 * 1.0 + 0.2 * 5 / 6)
    feedback = ep.messages[-2].content
    assert feedback.startswith("SLATE ") and feedback.endswith("5 guesses left.")


async def test_loss_and_invalid_guesses_never_crash():
    env = load_environment()
    task = Task(id="x", prompt=[Message(role="user", content="go")], answer="crane", env="wordle")
    script = ["hmm", "<guess>cranes</guess>", "<guess>qxzvk</guess>", "<guess>slate</guess>", "<guess>react</guess>", "<guess>trace</guess>", "<guess>crane</guess>"]  # fmt: skip
    ep = await run_episode(env, task, script)
    assert not ep.errors and ep.num_turns == 6 and ep.stop_reason == "done" and not ep.state["won"]
    assert (
        ep.rewards["invalid_guesses"] == 3
        and ep.rewards["win"] == 0.0
        and ep.rewards["num_guesses"] == 6
    )
    feedback = [m.content for m in ep.messages if m.role == "user"][1:]
    assert feedback[0].startswith("No guess found") and "not a five-letter word" in feedback[1]
    assert feedback[-1].endswith("1 guess left.")


async def test_max_turns_limit_cuts_a_long_game():
    env = load_environment()
    env.limits.max_turns = 3
    task = Task(id="x", prompt=[Message(role="user", content="go")], answer="crane", env="wordle")
    ep = await run_episode(env, task, ["<guess>slate</guess>"] * 6)
    assert (
        ep.truncated
        and ep.stop_reason == "max_turns"
        and ep.num_turns == 3
        and ep.rewards["win"] == 0.0
    )


async def test_token_level_masks(tiny_tokenizer):
    env = load_environment()
    task = next(t for t in env.get_tasks("eval", 5) if t.answer != "slate")
    script = ["Let me start. <guess>slate</guess>", "oops", f"<guess>{task.answer}</guess>"]
    ep = await run_episode(env, task, script, tiny_tokenizer)
    check_token_invariants(ep, env, tiny_tokenizer)
    assert ep.rewards["win"] == 1.0 and ep.rewards["invalid_guesses"] == 1.0


def test_pool_is_fixed_split_and_small():
    pool = word_pool(200)
    assert len(pool) == 200 and pool == word_pool(200) and set(pool) <= set(word_lists()[0])
    train = {t.answer for t in make_tasks("train", 500, 0, pool=200)}
    test = {t.answer for t in make_tasks("eval", 500, 0, pool=200)}
    assert train | test == set(pool) and not train & test
    left = consistent(pool, [("slate", score_guess("slate", pool[0]))])
    assert pool[0] in left and left == sorted(left) and len(left) < len(pool)
    with pytest.raises(ValueError, match="pool=0"):
        load_environment(pool=0)
    with pytest.raises(ValueError, match="hint=-1"):
        load_environment(hint=-1)


async def test_hint_lists_the_words_still_possible():
    env = load_environment(pool=300, hint=3)
    assert "one of 300 words" in env.system_prompt
    task = env.get_tasks("eval", 1)[0]
    ep = await run_episode(env, task, ["<guess>slate</guess>", "no guess", f"<guess>{task.answer}</guess>"])  # fmt: skip
    first, second = [m.content for m in ep.messages if m.role == "user"][1:3]
    left = consistent(word_pool(300), [("slate", score_guess("slate", task.answer))])
    assert task.answer in left
    listed = first.splitlines()[1]
    assert listed.startswith(f"Possible words: {', '.join(left[:3])}")
    assert (f"(and {len(left) - 3} more)" in listed) == (len(left) > 3)
    assert second.splitlines()[1] == listed  # an invalid reply narrows nothing
    assert ep.state["won"] and ep.num_turns == 3


async def test_teacher_picks_a_listed_word_and_wins_the_easy_game():
    from looprl.sft import teachers

    env = load_environment(pool=300, hint=10)
    tasks = env.get_tasks("train", 20, seed=1)
    episodes = await teachers.teacher_episodes(env, lambda task: teachers.wordle, tasks)
    assert all(e.rewards["win"] == 1.0 for e in episodes)
    for e in episodes:
        for prev, reply in zip(e.messages, e.messages[1:], strict=False):
            if reply.role == "assistant" and "Possible words: " in prev.content:
                first = prev.content.split("Possible words: ")[1].split(",")[0].split()[0]
                assert reply.content == f"<guess>{first}</guess>"
