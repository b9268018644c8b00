"""Self-bootstrap before RL: sample many attempts, keep the successes, fine-tune on them, repeat.

Expert iteration as STaR (Zelikman et al. 2022, arXiv:2203.14465) and ReST-EM (Singh et al.
2023, arXiv:2312.06585) run it, for a model that scores too rarely for GRPO to have signal.
Round n samples `attempts` per task over a new slice of `tasks` training tasks with the model
round n-1 trained (round 1: the starting model, or a teacher server), through `run_eval` (so a
killed round resumes without repeating finished groups). The rubric decides success; identical
completions are kept once and at most `max_per_task` per task. Unless the round stops, the
starting model is fine-tuned with `looprl.sft` on every success kept so far (`sft_from =
"start"`) and saved as `round_n/model`. A round stops the bootstrap when:

1. its GRPO signal (`looprl.sft.successes.signal_fraction` at the trainer's group size) reaches
   `handover_signal`: its model is handed over to `looprl train`;
2. its pass@1 does not beat the best round's by `min_gain` (and, with `rationalize`, neither does
   its hinted success rate beat the best earlier round's): the best round's model is handed over;
3. it kept no new success: nothing to fine-tune on (the message names the fixes);
4. it is round `max_rounds`: it measures the model the round before trained.

With `rationalize` (STaR's rationalisation), each task none of whose attempts succeeded is tried
again `hinted_attempts` times with the environment's hint (`Environment.hint`, e.g. its answer
in a note: `--env.kwargs.hint_style answer` on calculator and reasoning_gym). Its successes are
kept with a note hint removed from the conversation, so the model is fine-tuned to write,
unhinted, what it wrote with the hint (a hinted tool call stays, as the model's own turn). The
round's pass rates and signal count the unhinted attempts only; `hinted` in its record counts
these successes, which also keep a round from stopping for want of successes. Near pass@1 = 0
the hinted success rate is the measure of progress (the model learns to finish what a hint
starts before it starts alone), so a rising one keeps the rounds going. A round that stops
whatever its hinted attempts show (a hand-over; a last round whose pass@1 rose) samples none.

With `probe_attempts`, a round first samples that many attempts of each task, and the rest of
`attempts` (into `more_samples/`) only when one of them succeeds: a model that cannot yet pass
alone spends its round on hinted attempts instead of confirming a pass rate of 0 (the round's
record then counts the probe's attempts, and its pass@k is at k = `probe_attempts`).

Departures: STaR and ReST-EM fine-tune on the last round's samples only; here every round's
kept successes stay in the data (a small model finds few per round). With `sft_from =
"previous"` a round instead fine-tunes the model the round before trained on its own new
successes: the earlier rounds' data is already in that model, and a round's fine-tune costs what
its new data costs, where fine-tuning the starting model on everything grows with every round.
A teacher round samples a server's model (message level); its traces, like every trace here, are
fine-tuned on as messages re-rendered by the model's own chat template, not as the sampler's
token ids.

`DIR/bootstrap.jsonl` holds one row per finished round (`RoundRecord`); `DIR/round_n/` the
round's samples (`samples/results.jsonl`), its successes as SFT JSONL (`successes.jsonl`) and
its model (`model/`). `--resume` continues at the first unfinished round.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from looprl.console import progress
from looprl.engines.base import Engine
from looprl.engines.heap import return_free_memory
from looprl.envs.base import Environment
from looprl.envs.hints import ends_with_note, with_hint
from looprl.eval.run import EvalJob, run_eval, solved, traces_from_episodes
from looprl.files import iter_jsonl, write_text_atomically, writing
from looprl.rendering.renderer import Renderer
from looprl.rollout.loop import RolloutConfig
from looprl.sft.config import BootstrapSection
from looprl.sft.successes import (
    RoundStats,
    completion_key,
    keep_successes,
    round_stats,
    task_counts,
)
from looprl.types import EpisodeResult, SamplingParams, Task

Stop = Literal["handover", "stalled", "no_successes", "max_rounds"]
RECORDS = "bootstrap.jsonl"
REST_SEED_STRIDE = 1_000_003
"""The rest of a probed round samples on seed (seed + n) * this + 1, which no round's own seed
(seed + n) reaches."""


class SamplingFailed(Exception):
    """A round's sampling failed (at least half its attempts errored); the message says why."""


@dataclass
class Sampler:
    """What samples a round: an engine, the renderer a token-level engine needs (None for a
    message-level one) and a name for the records."""

    engine: Engine
    renderer: Renderer | None
    name: str


class Student(Protocol):
    """The model being bootstrapped: a sampler on one of its saved models, and fine-tuning."""

    def sampler(self, model: str) -> Sampler:
        """A sampler on `model` (the starting model's name or a round's model directory)."""
        ...

    def finetune(self, base: str, rows: list[dict[str, Any]], output: Path) -> int:
        """Fine-tune `base` (the starting model or a round's model directory) on `rows` (SFT
        JSONL rows), save it to `output`; the optimizer steps."""
        ...


@dataclass
class BootstrapJob:
    """A bootstrap ready to run: the environment, the `[bootstrap]` settings, the model
    (`student`, starting from `start_model`), an optional teacher for round 1, and where to
    write (`output`). `group_size` is the trainer's rollouts_per_task; `seed` picks the tasks
    and seeds the sampling."""

    env: Environment
    section: BootstrapSection
    student: Student
    start_model: str
    output: Path
    group_size: int
    seed: int = 0
    max_tokens: int | None = None
    teacher: Callable[[], Sampler] | None = None
    resume: bool = False
    on_round: Callable[[RoundRecord], None] | None = None


@dataclass(frozen=True)
class RoundRecord:
    """One row of `bootstrap.jsonl`: what a round sampled, measured, kept and trained.

    `sampled_model` made the attempts (`sampler` names the engine's model: the teacher's for a
    teacher round); `kept` counts the successes this round added (`kept_total`: all rounds');
    `model` is the directory of the model it trained (None when it stopped instead: `stop`).
    `tokens` counts the tokens sampled; `seconds` the round's wall time in the process that
    finished it (`sample_seconds` generating, `sft_seconds` fine-tuning).
    """

    round: int
    by: Literal["model", "teacher"]
    sampler: str
    sampled_model: str
    stats: RoundStats
    kept: int
    kept_total: int
    sft_steps: int
    model: str | None
    tokens: int
    seconds: float
    sample_seconds: float
    sft_seconds: float
    stop: Stop | None
    hinted: int = 0
    """Successes kept from hinted attempts (`rationalize`; not counted in `kept` or the stats)."""
    hinted_attempts: int = 0
    """Hinted attempts sampled (`rationalize`)."""
    hinted_successes: int = 0
    """Hinted attempts that succeeded, before successes are deduplicated and capped."""

    @property
    def hinted_rate(self) -> float | None:
        """The round's hinted success rate (None when it sampled no hinted attempt)."""
        return rate(self.hinted_successes, self.hinted_attempts)

    def to_row(self) -> dict[str, Any]:
        """The JSON row: the record's fields with the statistics inlined."""
        row = dataclasses.asdict(self)
        return {**row.pop("stats"), **row}

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> RoundRecord:
        """Read a row written by `to_row`."""
        names = {f.name for f in dataclasses.fields(RoundStats)}
        stats = RoundStats(**{k: v for k, v in row.items() if k in names})
        return cls(stats=stats, **{k: v for k, v in row.items() if k not in names})


@dataclass
class BootstrapOutcome:
    """The finished bootstrap: every round, why it stopped and the model handed over (the
    measured model with the GRPO signal, or the best round's)."""

    records: list[RoundRecord]
    stop: Stop
    handover_model: str
    handover_round: int


def run_bootstrap(job: BootstrapJob) -> BootstrapOutcome:
    """Run rounds until one stops (see the module doc); resume the finished ones with `resume`."""
    records = read_records(job.output) if job.resume else []
    rows = kept_rows(job.output, records)
    seen = {row_key(r) for r in rows}
    while not records or (records[-1].stop is None and len(records) < job.section.max_rounds):
        record = run_round(job, len(records) + 1, records, rows, seen)
        append_record(job.output, record)
        records.append(record)
        if job.on_round is not None:
            job.on_round(record)
    return outcome(job, records)


def run_round(
    job: BootstrapJob,
    n: int,
    records: list[RoundRecord],
    rows: list[dict[str, Any]],
    seen: set[str],
) -> RoundRecord:
    """Sample round `n`, keep its new successes (added to `rows` and `seen`), and fine-tune
    unless it stops; its record."""
    t0 = time.perf_counter()
    by: Literal["model", "teacher"] = "teacher" if n == 1 and job.teacher else "model"
    sampled = job.start_model if n == 1 else str(records[-1].model)
    sampler = job.teacher() if job.teacher and by == "teacher" else job.student.sampler(sampled)
    section = job.section

    def wants_hints(attempts: list[EpisodeResult]) -> bool:
        """Rationalise a round that may fine-tune or whose stop depends on its hinted rate (a
        stall, or not); not one that stops whatever they show (a hand-over)."""
        stats = round_stats(task_counts(attempts, section.success_threshold), job.group_size)
        best_case = stop_reason(section, n, by, stats, 1, records, hinted_rate=1.0)
        worst_case = stop_reason(section, n, by, stats, 1, records, hinted_rate=None)
        return section.rationalize and (best_case is None or best_case != worst_case)

    episodes, hinted_episodes, sample_seconds, tokens = asyncio.run(
        sample_round(job, n, sampler, wants_hints)
    )
    sampler_name = sampler.name
    del sampler  # its engine and model are not needed while fine-tuning: free them
    return_free_memory()
    stats = round_stats(task_counts(episodes, section.success_threshold), job.group_size)
    kept = keep_successes(episodes, section.success_threshold, section.max_per_task, seen)
    unhinted = [without_note_hint(ep) for ep in hinted_episodes]
    hinted = keep_successes(unhinted, section.success_threshold, section.max_per_task, seen)
    new_rows = success_rows(job.env, kept + hinted, section.success_threshold)
    round_dir = job.output / f"round_{n}"
    write_rows(round_dir / "successes.jsonl", new_rows)
    rows += new_rows
    solved_hinted = sum(solved(ep, section.success_threshold) for ep in hinted_episodes)
    hinted_rate = rate(solved_hinted, len(hinted_episodes))
    stop = stop_reason(section, n, by, stats, len(kept) + len(hinted), records, hinted_rate)
    steps, model, t1 = 0, None, time.perf_counter()
    if stop is None:
        base, data = (
            (job.start_model, rows)
            if section.sft_from == "start"
            else (str(records[-1].model) if records else job.start_model, new_rows)
        )
        steps = job.student.finetune(base, data, round_dir / "model")
        model = str(round_dir / "model")
        return_free_memory()  # the fine-tune's model and optimizer, before the next round samples
    return RoundRecord(
        round=n, by=by, sampler=sampler_name, sampled_model=sampled, stats=stats,
        kept=len(kept), kept_total=len(rows), sft_steps=steps, model=model, tokens=tokens,
        seconds=time.perf_counter() - t0, sample_seconds=sample_seconds,
        sft_seconds=time.perf_counter() - t1 if stop is None else 0.0, stop=stop,
        hinted=len(hinted), hinted_attempts=len(hinted_episodes), hinted_successes=solved_hinted,
    )  # fmt: skip


def round_tasks(job: BootstrapJob, n: int) -> list[Any]:
    """Round `n`'s slice of the seeded training stream: tasks (n-1)*T .. n*T-1."""
    size = job.section.tasks
    stream = job.env.iter_train_tasks(job.seed, start=(n - 1) * size)
    return list(itertools.islice(stream, size))


async def sample_round(
    job: BootstrapJob,
    n: int,
    sampler: Sampler,
    wants_hints: Callable[[list[EpisodeResult]], bool] = lambda episodes: False,
) -> tuple[list[EpisodeResult], list[EpisodeResult], float, int]:
    """Every attempt of round `n` (the probe's, and the rest when one succeeded: module doc),
    then, when `wants_hints(attempts)`, every hinted attempt at
    the tasks none of them solved (kept ones of a killed run are reused), the seconds spent
    generating and the tokens sampled; the engine is closed after."""
    section = job.section
    try:
        tasks = round_tasks(job, n)
        first = section.probe_attempts or section.attempts
        episodes, seconds, tokens = await sample_tasks(job, n, sampler, tasks, "samples", first)
        if first < section.attempts and any(
            solved(ep, section.success_threshold) for ep in episodes
        ):
            rest = section.attempts - first
            seed = (job.seed + n) * REST_SEED_STRIDE + 1  # not the probe's: no attempt twice
            more, more_seconds, more_tokens = await sample_tasks(
                job, n, sampler, tasks, "more_samples", rest, seed=seed
            )
            episodes += more
            seconds, tokens = seconds + more_seconds, tokens + more_tokens
        hinted: list[EpisodeResult] = []
        retry = hinted_tasks(job, n, tasks, episodes) if wants_hints(episodes) else []
        if retry:
            hinted, more_seconds, more_tokens = await sample_tasks(
                job, n, sampler, retry, "hinted", section.hinted_attempts
            )
            seconds, tokens = seconds + more_seconds, tokens + more_tokens
    finally:
        await sampler.engine.close()
    return episodes, hinted, seconds, tokens


async def sample_tasks(
    job: BootstrapJob,
    n: int,
    sampler: Sampler,
    tasks: list[Task],
    folder: str,
    attempts: int,
    seed: int | None = None,
) -> tuple[list[EpisodeResult], float, int]:
    """`attempts` samples of each of `tasks` into `round_n/folder` (resumable) on sampling seed
    `seed` (default: the round's, seed + n), the seconds spent generating and the tokens
    sampled."""
    section = job.section
    seed = job.seed + n if seed is None else seed
    sampling = SamplingParams(
        max_tokens=job.max_tokens or job.env.limits.max_tokens_per_turn,
        temperature=section.attempt_temperature, seed=seed,
    )  # fmt: skip
    eval_job = EvalJob(
        env=job.env, engine=sampler.engine, tasks=tasks, rollouts_per_task=attempts,
        renderer=sampler.renderer, config=RolloutConfig(sampling=sampling, seed=seed),
        output=job.output / f"round_{n}" / folder, resume=True,
        metadata={"kind": "bootstrap", "round": n, "model": sampler.name,
                  "hinted": folder == "hinted"},
        pass_threshold=section.success_threshold,
    )  # fmt: skip
    label = f"round {n}" if folder == "samples" else f"round {n}, {folder.replace('_', ' ')}"
    with progress(label, len(tasks) * attempts) as advance:
        counts: dict[str, tuple[int, int]] = {}

        def on_group(group: list[EpisodeResult]) -> None:
            counts.update(task_counts(group, section.success_threshold))
            stats = round_stats(counts, job.group_size)
            advance(len(group), f"pass@1 {stats.pass_at_1:.3f} pass@{stats.k} "
                    f"{stats.pass_at_k:.3f}, {stats.successes} successes")  # fmt: skip

        eval_job.on_group = on_group
        done = await run_eval(eval_job)
    if done.status == "failed":
        raise SamplingFailed(
            f"round {n}: sampling failed: {done.headline}; fix the cause and rerun with --resume "
            "(finished groups are kept)"
        )
    return done.episodes, done.seconds, int(done.summary["generated_tokens"])


def hinted_tasks(
    job: BootstrapJob, n: int, tasks: list[Task], episodes: list[EpisodeResult]
) -> list[Task]:
    """The round's tasks none of whose attempts succeeded, each with the environment's hint
    (tasks it gives none are left out); the hints are drawn from a generator seeded by round."""
    counts = task_counts(episodes, job.section.success_threshold)
    rng = random.Random(f"bootstrap-hints-{job.seed}-{n}")
    out = []
    for task in tasks:
        if counts.get(task.id, (0, 0))[1] > 0:
            continue
        hint = job.env.hint(task, rng)
        if hint is not None:
            out.append(with_hint(task, hint))
    return out


def without_note_hint(episode: EpisodeResult) -> EpisodeResult:
    """The episode with its hint's note (the prompt's last message) taken out of its messages;
    other episodes (no hint, a hinted tool call alone) as they are."""
    if not ends_with_note(episode.task):
        return episode
    note = episode.task.prompt[-1]
    kept = list(episode.messages)
    kept.remove(note)
    return dataclasses.replace(episode, messages=kept)


def stop_reason(
    section: BootstrapSection,
    n: int,
    by: str,
    stats: RoundStats,
    kept: int,
    records: list[RoundRecord],
    hinted_rate: float | None = None,
) -> Stop | None:
    """Why round `n` stops the bootstrap (module doc, in that order), or None to fine-tune.

    `hinted_rate`: the round's hinted success rate (None: no hinted attempt); with
    `rationalize`, one that beats the best earlier round's by `min_gain` is progress as a pass@1
    that does is. A teacher round is not the model's own measure: only `no_successes` stops it.
    """
    if by == "teacher":
        return "no_successes" if kept == 0 else None
    best = best_record(records)
    if stats.signal >= section.handover_signal:
        return "handover"
    rose = best is None or stats.pass_at_1 >= best.stats.pass_at_1 + section.min_gain
    if not rose and not (section.rationalize and hints_progressed(section, hinted_rate, records)):
        return "stalled"
    if kept == 0:
        return "no_successes"
    return "max_rounds" if n >= section.max_rounds else None


def rate(successes: int, attempts: int) -> float | None:
    """Successes per attempt (None for no attempt)."""
    return successes / attempts if attempts else None


def hints_progressed(
    section: BootstrapSection, hinted_rate: float | None, records: list[RoundRecord]
) -> bool:
    """Whether a round's hinted success rate beats every earlier round's by `min_gain` (an
    earlier round with no hinted attempt counts as 0)."""
    if hinted_rate is None:
        return False
    earlier = [r.hinted_rate or 0.0 for r in records if r.by == "model"]
    return hinted_rate >= max(earlier, default=0.0) + section.min_gain


def best_record(records: list[RoundRecord]) -> RoundRecord | None:
    """The model-sampled round with the highest pass@1, if any; of equals, the one with the
    highest hinted success rate, then the earliest."""
    own = [r for r in records if r.by == "model"]
    return max(own, key=lambda r: (r.stats.pass_at_1, r.hinted_rate or 0.0, -r.round), default=None)


def outcome(job: BootstrapJob, records: list[RoundRecord]) -> BootstrapOutcome:
    """The model handed over: the last round's when it reached the signal, else the best's."""
    last = records[-1]
    stop: Stop = last.stop or "max_rounds"
    chosen = last if stop == "handover" else (best_record(records) or last)
    return BootstrapOutcome(records, stop, chosen.sampled_model, chosen.round)


def success_rows(
    env: Environment, kept: list[EpisodeResult], threshold: float
) -> list[dict[str, Any]]:
    """SFT rows of the kept successes (`traces_from_episodes`), each with its task id."""
    rows = traces_from_episodes(env, kept, threshold)
    return [{"task": ep.task.id, **row} for ep, row in zip(kept, rows, strict=True)]


def row_key(row: dict[str, Any]) -> str:
    """`completion_key` of a written success row."""
    return completion_key(row["task"], row["messages"])


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write SFT rows as JSONL, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(path, "".join(json.dumps(r) + "\n" for r in rows))


def append_record(output: Path, record: RoundRecord) -> None:
    """Append a finished round's row to `bootstrap.jsonl` (the round is done once it is there)."""
    path = output / RECORDS
    with writing(path), path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record.to_row()) + "\n")


def read_records(output: Path) -> list[RoundRecord]:
    """The finished rounds in `output/bootstrap.jsonl` (none when it does not exist)."""
    path = output / RECORDS
    if not path.exists():
        return []
    fix = "each line is one finished round; remove a damaged last line and rerun with --resume"
    return [RoundRecord.from_row(row) for _, row in iter_jsonl(path, fix=fix)]


def kept_rows(output: Path, records: list[RoundRecord]) -> list[dict[str, Any]]:
    """Every success row the finished rounds kept, in round order."""
    rows: list[dict[str, Any]] = []
    for r in records:
        path = output / f"round_{r.round}" / "successes.jsonl"
        rows += [row for _, row in iter_jsonl(path, fix="rerun the bootstrap into a new --output")]
    return rows
