"""Streaming groups: episodes start continuously and a step trains the first groups to finish.

With `trainer.streaming = true` no step waits for the slowest episode of a batch. The rules:

- groups start in task-stream order (position p of the seeded stream, as the barrier loop reads
  it) while the groups admitted (trained, queued, running) stay within `tasks_per_step x
  (version + 1 + k)`, k = `trainer.max_async_steps` (AReaL's admission rule), and at most
  `rollout.max_inflight_groups` are running or queued;
- a group joins the queue when its last episode has ended and the group is scored; a step takes
  the first `tasks_per_step` groups of the queue, in the order they finished; the rest are
  carried over to later steps;
- with dynamic sampling a group whose rewards are all equal is filtered as it arrives and
  another starts in its place (refill), at most `refill` per step; past that such groups queue;
- a group records the oldest policy version that sampled it (the engine's when the group
  started: its episodes start together); one more than `max_staleness` updates behind the
  policy a step trains is dropped and counted;
- a weight sync on an engine that cannot update in flight closes a gate to new requests and
  waits for those being generated (`RequestGate`); episodes between two turns (in a tool call)
  keep going and sample their next turn from the new weights, each token's logprob its own
  sampler's; with `in_flight_updates` the requests run through the sync as well;
- a checkpoint keeps `state()`: the queued groups in full, the positions started but not
  finished (restarted first on resume, from the same task positions) and the cursor.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from looprl.engines.base import Engine, GenerationRequest, TrainableEngine
from looprl.envs.base import Environment
from looprl.rendering.renderer import Renderer
from looprl.rollout.loop import RolloutConfig, episode_seed, run_group
from looprl.safe_json import dumps
from looprl.trainer.async_batches import Batch, Groups, Update
from looprl.trainer.config import TrainConfig
from looprl.types import EpisodeResult, Generation, SamplingParams, Task

RunGroup = Callable[[int], Awaitable[list[EpisodeResult]]]
"""Roll out and score the group of the task at a position of the seeded task stream."""

LEDGER = "stream_ledger.jsonl"
"""`RUN/stream_ledger.jsonl`: one line per trained episode (step, position, task, rollout)."""


def has_variance(group: list[EpisodeResult]) -> bool:
    """Whether the group's trainable episodes disagree on the reward (DAPO's dynamic sampling)."""
    return len({ep.reward for ep in group if ep.trainable}) > 1


@dataclass
class StreamGroup:
    """A finished group, its task's position in the stream and the version that sampled it."""

    position: int
    episodes: list[EpisodeResult]
    version: int

    def staleness(self, step: int) -> int:
        """Updates between the policy that sampled the group and the one step `step` trains."""
        return max(0, step - 1 - self.version)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (a checkpoint's queued group)."""
        episodes = [ep.to_dict() for ep in self.episodes]
        return {"position": self.position, "version": self.version, "episodes": episodes}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StreamGroup:
        """Inverse of `to_dict`."""
        episodes = [EpisodeResult.from_dict(e) for e in d["episodes"]]
        return cls(int(d["position"]), episodes, int(d["version"]))


class RequestGate:
    """The engine as streaming rollouts see it: it holds new requests while the weights change,
    and clocks the seconds the engine had no request to serve."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.token_level = engine.token_level
        self.open = asyncio.Event()  # cleared while the weights change
        self.open.set()
        self.quiet = asyncio.Event()  # set while no request is being generated
        self.quiet.set()
        self.requests = 0
        self.idle_s = 0.0
        self.since = time.perf_counter()  # when the engine last became idle

    async def generate(self, request: GenerationRequest) -> Generation:
        """The engine's generation, once the gate is open, counted as busy time."""
        await self.open.wait()
        if self.requests == 0:
            self.idle_s += time.perf_counter() - self.since
            self.quiet.clear()
        self.requests += 1
        try:
            return await self.engine.generate(request)
        finally:
            self.requests -= 1
            if self.requests == 0:
                self.since = time.perf_counter()
                self.quiet.set()

    async def hold(self) -> None:
        """Close the gate and wait until no request is being generated."""
        self.open.clear()
        await self.quiet.wait()

    def release(self) -> None:
        """Open the gate: held requests go to the engine."""
        self.open.set()

    async def close(self) -> None:
        """Nothing of its own: the trainer closes the engine."""

    def take_idle(self) -> float:
        """Idle seconds since the last call (the idle stretch under way included)."""
        now = time.perf_counter()
        idle = self.idle_s + (now - self.since if self.requests == 0 else 0.0)
        self.idle_s, self.since = 0.0, now
        return idle


class GroupStream:
    """The producer and its queue of finished groups (module doc)."""

    def __init__(
        self, run_group: RunGroup, version: Callable[[], int], *, per_step: int, ahead: int,
        capacity: int | None = None, trained: int = 0,
        keep: Callable[[list[EpisodeResult]], bool] | None = None, refill: int = 0,
        cursor: int = 0, restart: Iterable[int] = (), queued: Iterable[StreamGroup] = (),
        stride: int = 1,
    ) -> None:  # fmt: skip
        self.run_group, self.version = run_group, version
        self.per_step, self.ahead, self.capacity = per_step, ahead, capacity
        self.trained = trained  # groups taken by steps so far
        self.keep, self.refill, self.refill_left = keep, refill, refill
        self.cursor = cursor  # the next position of the task stream to start
        self.stride = stride  # positions between two this stream starts (N ranks: N)
        self.restart = list(restart)  # positions started before a resume, started first
        self.queue = list(queued)
        self.running: dict[int, asyncio.Task[None]] = {}
        self.paused = False
        self.filtered = 0  # zero-variance groups filtered since the last take
        self.arrived = asyncio.Event()
        self.failure: BaseException | None = None

    def room(self) -> bool:
        """Whether another group may start: fewer than `capacity` running or queued, and the
        groups admitted so far (trained, queued, running) within `per_step x (version + 1 +
        ahead)`, so a group can be trained by the step `ahead` after its version's (AReaL's rule).
        """
        outstanding = len(self.running) + len(self.queue)
        budget = self.per_step * (self.version() + 1 + self.ahead) - self.trained
        full = self.capacity is not None and outstanding >= self.capacity
        return not self.paused and not full and outstanding < budget

    def fill(self) -> None:
        """Start groups, restarts first, while there is `room`."""
        while self.room():
            if self.restart:
                position = self.restart.pop(0)
            else:
                position, self.cursor = self.cursor, self.cursor + self.stride
            self.running[position] = asyncio.create_task(self._one(position))

    async def _one(self, position: int) -> None:
        version = self.version()
        try:
            episodes = await self.run_group(position)
        except Exception as exc:  # ToolsHung and the like: the step waiting on it raises
            self.failure = self.failure or exc  # the first one is the cause
            self.arrived.set()
            return
        finally:
            del self.running[position]
        for ep in episodes:
            ep.policy_version = version
        if self.keep is not None and self.refill_left > 0 and not self.keep(episodes):
            self.filtered += 1
            self.refill_left -= 1
        else:
            self.queue.append(StreamGroup(position, episodes, version))
        self.arrived.set()
        self.fill()

    async def take(self, n: int, step: int, max_staleness: int) -> tuple[list[StreamGroup], int]:
        """The first `n` finished groups fresh enough for step `step`, waiting for them as long
        as needed; also the episodes dropped as staler than `max_staleness`."""
        dropped = 0
        self.fill()
        while True:
            if self.failure is not None:
                raise self.failure
            dropped += self.drop_stale(step, max_staleness)
            if len(self.queue) >= n:
                break
            self.arrived.clear()
            await self.arrived.wait()
        return self.remove({g.position for g in self.queue[:n]}), dropped

    def drop_stale(self, step: int, max_staleness: int) -> int:
        """Drop the queued groups staler than `max_staleness` for step `step`; their episodes."""
        stale = [g for g in self.queue if g.staleness(step) > max_staleness]
        if stale:
            self.queue = [g for g in self.queue if g.staleness(step) <= max_staleness]
            self.fill()
        return sum(len(g.episodes) for g in stale)

    def remove(self, positions: set[int]) -> list[StreamGroup]:
        """Take the queued groups at `positions` out, in queue order, as a step's: they count as
        trained, the refill budget starts again and new groups start."""
        taken = [g for g in self.queue if g.position in positions]
        self.queue = [g for g in self.queue if g.position not in positions]
        self.trained += len(taken)
        self.refill_left = self.refill
        self.fill()
        return taken

    def pause(self) -> None:
        """Start no group until `resume`."""
        self.paused = True

    async def drain(self) -> None:
        """Start nothing more and wait for every running group."""
        self.pause()
        while self.running:
            await asyncio.wait(list(self.running.values()))
        if self.failure is not None:
            raise self.failure

    def resume(self) -> None:
        """Start groups again."""
        self.paused = False
        self.fill()

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps besides the cursor: the positions started but not finished,
        and the finished groups not trained yet."""
        return {
            "restart": sorted(self.running) + self.restart,
            "queued": [g.to_dict() for g in self.queue],
        }


class StreamSource:
    """Streaming batches, as the training loop takes them: `take`, `train`, `synced`, `close`.

    `in_flight` is the engine's `in_flight_updates`: True lets requests run through a weight
    sync; False holds new requests at the gate and waits for those being generated (episodes
    between turns, in a tool call, keep going). `ledger` (rank 0's, or None) gets one line per
    trained episode.
    """

    def __init__(
        self, stream: GroupStream, gate: RequestGate, *, max_staleness: int, in_flight: bool,
        ledger: Path | None,
    ) -> None:  # fmt: skip
        self.stream, self.gate, self.max_staleness = stream, gate, max_staleness
        self.in_flight, self.ledger = in_flight, ledger
        self.begin = self.last = time.perf_counter()  # the step's start; the last take
        self.wait = self.hold = 0.0  # seconds the step waited: in all, and for the gate
        self.batch: Batch | None = None

    async def take(self, step: int) -> Batch:
        """Step `step`'s groups, with the `stream/` metrics of how they came."""
        t0 = time.perf_counter()
        taken, dropped, carried, refilled = await self.groups(step)
        now = time.perf_counter()
        self.wait, seconds, self.last = now - t0, now - self.last, now
        extra = {
            "stream/groups_carried": float(carried),
            "stream/sampler_idle_s": self.gate.take_idle(),
            "stream/refilled": float(refilled),
        }
        self.stream.filtered = 0
        for g in taken:
            key = f"stream/staleness_{g.staleness(step)}"
            extra[key] = extra.get(key, 0.0) + 1.0
        self._record(step, taken)
        oldest = min(g.version for g in taken)
        groups = [g.episodes for g in taken]
        self.batch = Batch(groups, seconds, oldest, self.max_staleness, dropped, extra)
        return self.batch

    async def groups(self, step: int) -> tuple[list[StreamGroup], int, int, int]:
        """Step `step`'s groups; the episodes dropped as stale, the groups carried over and
        those filtered (refilled) since the last step."""
        taken, dropped = await self.stream.take(self.stream.per_step, step, self.max_staleness)
        return taken, dropped, len(self.stream.queue), self.stream.filtered

    def _record(self, step: int, taken: list[StreamGroup]) -> None:
        if self.ledger is None:
            return
        rows = [
            dumps({"step": step, "position": g.position, "task": ep.task.id,
                   "rollout": ep.rollout_index, "version": g.version})
            for g in taken for ep in g.episodes
        ]  # fmt: skip
        with open(self.ledger, "a", encoding="utf-8") as f:
            f.write("".join(row + "\n" for row in rows))

    async def train(self, update: Update, groups: Groups) -> dict[str, float]:
        """The update while groups keep running; then, unless the engine updates in flight, the
        gate closes and the requests being generated end (the engine is idle for the sync)."""
        metrics = await asyncio.to_thread(update, groups)
        if not self.in_flight:
            t0 = time.perf_counter()
            self.stream.pause()
            await self.gate.hold()
            self.hold = time.perf_counter() - t0
            self.wait += self.hold
        return metrics

    def synced(self) -> None:
        """The new weights are in: requests and groups go on; the step's wait is logged."""
        self.gate.release()
        self.stream.resume()
        now = time.perf_counter()
        wall, self.begin = now - self.begin, now
        if self.batch is not None:
            self.batch.extra["stream/trainer_wait_s"] = self.wait
            self.batch.extra["stream/trainer_wait_frac"] = self.wait / wall if wall > 0 else 0.0
            self.batch.extra["stream/sync_hold_s"] = self.hold
        self.hold = 0.0

    def state(self) -> dict[str, Any]:
        """The stream's part of a checkpoint: its task cursor and `GroupStream.state`."""
        return {"cursor": self.stream.cursor, "stream": self.stream.state()}

    async def close(self) -> None:
        """Let the running groups end (they are not trained) before the engine shuts down."""
        self.gate.release()
        await self.stream.drain()


def open_stream(
    cfg: TrainConfig, env: Environment, engine: TrainableEngine, *, renderer: Renderer,
    sampling: SamplingParams, task_at: Callable[[int], Task], dynamic: bool, cursor: int,
    saved: dict[str, Any] | None, step: int, run_dir: Path | None, in_flight: bool,
    world: int = 1,
) -> StreamSource:  # fmt: skip
    """The streaming source of a run at `step` (a checkpoint's `saved` stream state when
    resumed): groups of `rollout.rollouts_per_task` episodes from task position `cursor` on.
    `run_dir` (rank 0's) holds the ledger, cut back to `step`. `in_flight`: the placement can
    sync while requests generate (`trainer.in_flight_updates` may still turn it off). With
    `world` N > 1 ranks this rank's stream (`looprl.trainer.stream_shared`): every N-th position
    from `cursor`, and a 1/N share (rounded up) of the per-step admission and refill budgets."""
    rc, tc = cfg.rollout, cfg.trainer
    per_step = -(-rc.tasks_per_step // world)
    gate = RequestGate(engine)

    async def run(position: int) -> list[EpisodeResult]:
        seed = episode_seed(tc.seed, "stream", position, 0)  # per position: a restart repeats it
        config = RolloutConfig(sampling=sampling, seed=seed)
        task = task_at(position)
        return await run_group(
            env, gate, task, rc.rollouts_per_task, renderer=renderer, config=config
        )

    saved = saved or {}
    stream = GroupStream(
        run, lambda: engine.policy_version, per_step=per_step, ahead=tc.max_async_steps,
        capacity=rc.max_inflight_groups, trained=int(saved.get("trained", step * per_step)),
        keep=has_variance if dynamic else None, refill=per_step * rc.max_refill_rounds,
        cursor=cursor, restart=saved.get("restart", ()), stride=world,
        queued=[StreamGroup.from_dict(g) for g in saved.get("queued", ())],
    )  # fmt: skip
    ledger = None if run_dir is None else run_dir / LEDGER
    if ledger is not None:
        truncate_ledger(ledger, step)
    return StreamSource(
        stream, gate, max_staleness=tc.max_async_steps,
        in_flight=in_flight and tc.in_flight_updates, ledger=ledger,
    )  # fmt: skip


def truncate_ledger(path: Path, step: int) -> None:
    """Keep the ledger lines of steps <= `step` (a resumed run goes on from that checkpoint)."""
    import json

    if path.is_file():
        lines = path.read_text(encoding="utf-8").splitlines()
        kept = [line for line in lines if line and json.loads(line)["step"] <= step]
        path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
