"""Streaming groups (`trainer.streaming`): order, carry-over, refill, stale drops, drain, state."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from helpers import small_config

from looprl.engines.base import GenerationRequest
from looprl.engines.scripted import ScriptedEngine
from looprl.trainer import distributed as D
from looprl.trainer.config import ConfigError, load_config
from looprl.trainer.streaming import GroupStream, RequestGate, StreamGroup, StreamSource
from looprl.types import EpisodeResult, Message, Task


def group_of(position: int, rewards: tuple[float, ...] = (0.0, 1.0)) -> list[EpisodeResult]:
    task = Task(id=f"t{position}", prompt=[Message(role="user", content="hi")])
    return [EpisodeResult(task=task, reward=r, rollout_index=i) for i, r in enumerate(rewards)]


def runner(seconds: dict[int, float], log: list[int], rewards=lambda p: (0.0, 1.0)):
    """A group runner: position p takes `seconds[p]` (0.01 by default); starts are logged."""

    async def run(position: int) -> list[EpisodeResult]:
        log.append(position)
        await asyncio.sleep(seconds.get(position, 0.01))
        return group_of(position, rewards(position))

    return run


def test_a_step_takes_the_first_groups_to_finish_and_carries_the_rest() -> None:
    started: list[int] = []
    slow = {0: 0.3}  # the first task's group is the long tail
    version = [0]

    async def main():
        stream = GroupStream(runner(slow, started), lambda: version[0], per_step=2, ahead=1)
        first, dropped = await stream.take(2, step=1, max_staleness=1)
        version[0] = 1  # the update and the sync: two more groups may start
        stream.fill()
        await asyncio.sleep(0.05)  # positions 3 to 5 finished by now
        second, _ = await stream.take(2, step=2, max_staleness=1)
        carried = [g.position for g in stream.queue]
        await stream.drain()
        return first, second, carried, dropped

    first, second, carried, dropped = asyncio.run(main())
    assert [g.position for g in first] == [1, 2]  # 0 is still running: nobody waits for it
    assert [g.position for g in second] == [3, 4]
    assert carried == [5] and dropped == 0
    assert started == [0, 1, 2, 3, 4, 5]  # in task-stream order, 2 x (1 + k) at version 0


def test_zero_variance_groups_are_refilled_within_the_budget() -> None:
    started: list[int] = []
    flat = {0, 1, 2}  # these groups' rewards are all equal

    async def main():
        run = runner({}, started, rewards=lambda p: (1.0, 1.0) if p in flat else (0.0, 1.0))
        stream = GroupStream(
            run, lambda: 0, per_step=2, ahead=0, keep=lambda g: len({e.reward for e in g}) > 1,
            refill=2,
        )  # fmt: skip
        taken, _ = await stream.take(2, step=1, max_staleness=1)
        filtered = stream.filtered
        await stream.drain()
        return taken, filtered

    taken, filtered = asyncio.run(main())
    assert filtered == 2  # 0 and 1 replaced; the budget is then spent, so 2 is trained as is
    assert sorted(g.position for g in taken) == [2, 3]


def test_a_group_staler_than_the_bound_is_dropped_and_counted() -> None:
    version = [0]

    async def main():
        stream = GroupStream(runner({}, []), lambda: version[0], per_step=2, ahead=0)
        stream.fill()
        await asyncio.sleep(0.05)  # groups 0 and 1 finished under version 0
        version[0] = 3
        taken, dropped = await stream.take(2, step=4, max_staleness=2)
        await stream.drain()
        return taken, dropped

    taken, dropped = asyncio.run(main())
    assert dropped == 4  # two groups of two episodes, 3 updates behind the trained policy
    assert [g.position for g in taken] == [2, 3] and {g.version for g in taken} == {3}


def test_drain_waits_for_running_groups_and_starts_none_until_resume() -> None:
    started: list[int] = []

    async def main():
        stream = GroupStream(runner({0: 0.1}, started), lambda: 0, per_step=2, ahead=0)
        stream.fill()
        await stream.drain()
        after_drain = (list(stream.running), len(stream.queue), list(started))
        stream.resume()
        return after_drain, list(started)

    (running, queued, before), after = asyncio.run(main())
    assert running == [] and queued == 2 and before == [0, 1]
    assert after == [0, 1]  # 2 x (version 0 + 1) admitted: resume starts nothing more


def test_state_keeps_queued_groups_and_restarts_running_positions_first() -> None:
    started: list[int] = []

    async def main():
        stream = GroupStream(runner({0: 5.0}, started), lambda: 0, per_step=3, ahead=0)
        stream.fill()
        await asyncio.sleep(0.05)  # 1 and 2 finished, 0 is running
        saved = json.loads(json.dumps(stream.state()))  # a checkpoint holds JSON
        for task in stream.running.values():
            task.cancel()
        queued = [StreamGroup.from_dict(g) for g in saved["queued"]]
        resumed = GroupStream(
            runner({}, started), lambda: 1, per_step=3, ahead=0, trained=3,
            cursor=stream.cursor, restart=saved["restart"], queued=queued,
        )  # fmt: skip
        taken, _ = await resumed.take(3, step=1, max_staleness=1)
        await resumed.drain()
        return saved, taken

    saved, taken = asyncio.run(main())
    assert saved["restart"] == [0]
    assert [g["position"] for g in saved["queued"]] == [1, 2]
    assert [g.position for g in taken] == [1, 2, 0]  # the restarted group, not a new task
    assert started == [0, 1, 2, 0]  # and no more: version 1 with k = 0 admits 2 x 3 groups


def test_the_step_metrics_say_how_its_groups_came(tmp_path) -> None:
    gate = RequestGate(ScriptedEngine(["x"]))

    async def main():
        stream = GroupStream(runner({0: 0.3}, []), lambda: 1, per_step=2, ahead=1, trained=2)
        source = StreamSource(
            stream, gate, max_staleness=2, in_flight=False, ledger=tmp_path / "ledger.jsonl"
        )
        stream.fill()
        await asyncio.sleep(0.1)  # 1, 2 and 3 finished: the step need not wait
        batch = await source.take(3)
        await source.train(lambda groups: {}, batch.groups)
        source.synced()
        await source.close()
        return batch

    batch = asyncio.run(main())
    m = batch.metrics(3)
    assert m["stream/staleness_1"] == 2.0 and m["rollout/staleness"] == 1.0
    assert m["stream/groups_carried"] == 1.0  # group 3 finished beside 1 and 2
    assert m["stream/trainer_wait_s"] < 0.02 and m["stream/trainer_wait_frac"] < 0.2
    assert m["stream/sync_hold_s"] < 0.02  # no request was under way at the sync
    assert m["stream/sampler_idle_s"] > 0  # the runner never asked the engine for anything
    rows = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert [(r["step"], r["position"], r["rollout"]) for r in rows] == [
        (3, 1, 0), (3, 1, 1), (3, 2, 0), (3, 2, 1),
    ]  # fmt: skip


def test_the_idle_clock_counts_only_time_without_a_request() -> None:
    gate = RequestGate(ScriptedEngine(["x"], delay=0.1))

    async def main():
        gate.take_idle()
        from looprl.engines.base import GenerationRequest

        await asyncio.gather(gate.generate(GenerationRequest()), gate.generate(GenerationRequest()))
        return gate.take_idle()

    assert asyncio.run(main()) < 0.05  # both requests overlapped the whole 0.1 s


def test_streaming_settings_are_validated(tmp_path) -> None:
    with pytest.raises(ConfigError, match="trainer.streaming needs trainer.max_async_steps >= 1"):
        load_config(None, {"trainer.streaming": True})
    with pytest.raises(ConfigError, match="max_inflight_groups < rollout.tasks_per_step"):
        load_config(None, {"rollout.tasks_per_step": 4, "rollout.max_inflight_groups": 2})
    streaming = {"trainer.streaming": True, "trainer.max_async_steps": 1}
    with pytest.raises(ConfigError, match=r"\[curriculum\] and \[hints\] follow the pass rate"):
        load_config(None, {**streaming, "curriculum.enabled": True})
    cfg = small_config(tmp_path, "s", **{"trainer.streaming": True, "trainer.max_async_steps": 1})
    assert D.unsupported(cfg) == []  # in-process engines stream under torchrun
    on_vllm = cfg.model_copy(update={"engine": cfg.engine.model_copy(update={"kind": "vllm"})})
    assert D.unsupported(on_vllm) == [
        "trainer.streaming = true with engine.kind = 'vllm' (use one process, or "
        "trainer.streaming = false)"
    ]


@pytest.mark.parametrize("in_flight", [False, True])
def test_the_sync_waits_for_requests_under_way_unless_the_engine_updates_in_flight(in_flight):
    gate = RequestGate(ScriptedEngine(["x"], delay=0.2))

    async def main():
        stream = GroupStream(runner({}, []), lambda: 0, per_step=1, ahead=0)
        source = StreamSource(stream, gate, max_staleness=1, in_flight=in_flight, ledger=None)
        under_way = asyncio.create_task(gate.generate(GenerationRequest()))
        await asyncio.sleep(0.01)
        await source.train(lambda groups: {}, [])
        finished, paused = under_way.done(), stream.paused
        source.synced()
        await under_way
        return finished, paused, stream.paused

    finished, paused, after = asyncio.run(main())
    assert (finished, paused) == (not in_flight, not in_flight) and after is False


def test_a_group_that_raises_stops_the_step_waiting_for_it() -> None:
    async def run(position: int) -> list[EpisodeResult]:
        raise RuntimeError(f"no thread left for the tools of group {position}")

    async def main():
        stream = GroupStream(run, lambda: 0, per_step=1, ahead=1)
        stream.fill()
        await asyncio.sleep(0.01)  # both groups failed before anyone waited
        await stream.take(1, step=1, max_staleness=1)

    with pytest.raises(RuntimeError, match="no thread left for the tools of group 0"):
        asyncio.run(main())


def test_the_long_tail_env_slows_every_nth_episode_and_refuses_a_bad_setting() -> None:
    from looprl.rendering.parser import ParsedTurn
    from looprl.testing.long_tail import load_environment

    env = load_environment(every=2, slow_s=0.2)
    task = env.get_tasks("train", 1, seed=0)[0]

    async def main():
        states = [await env.setup_state(task) for _ in range(4)]
        t0 = time.perf_counter()
        await env.step(list(task.prompt), ParsedTurn(content="The answer is 1."), states[1])
        return [s["slow"] for s in states], time.perf_counter() - t0

    slow, seconds = asyncio.run(main())
    assert slow == [False, True, False, True] and seconds >= 0.2
    with pytest.raises(ValueError, match="use every >= 1 and slow_s >= 0"):
        load_environment(every=0)
