"""One evaluation path for `looprl eval`, the demo and the trainer's held-out evaluations.

`run_eval(job)` runs an `EvalJob` (an environment, an engine and its tasks) to the end: results
streamed to `results.jsonl`, resume, the summary, the verdict on errored episodes, and
`metadata.json` kept true at every exit (running, finished, failed, crashed, interrupted). The
trainer builds its job from what it already holds; `eval_job(cfg)` builds one from names (the
command line's flags, typed as `EvalConfig`); `evaluate_and_report(cfg)` adds the progress bar
and the printed table that `looprl eval` and the demo show.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from looprl.console import console
from looprl.engines.base import Engine
from looprl.engines.config import EngineSection
from looprl.envs.base import Environment
from looprl.evaluation import (
    Summary,
    error_headline,
    evaluate,
    load_results,
    summarize,
    write_metadata,
)
from looprl.rendering.renderer import Renderer
from looprl.rollout import RolloutConfig
from looprl.types import EpisodeResult, SamplingParams, Task

Status = Literal["finished", "finished_with_errors", "failed"]


@dataclass
class EvalJob:
    """An evaluation ready to run.

    `output` (a directory) receives `results.jsonl` and `metadata.json` (`metadata` is merged
    into the latter); without it nothing is written. `resume` keeps the finished groups already
    in `output` and runs the rest (and every group that holds an infrastructure error).
    """

    env: Environment
    engine: Engine
    tasks: list[Task]
    rollouts_per_task: int
    renderer: Renderer | None
    config: RolloutConfig
    output: Path | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    resume: bool = False
    pass_threshold: float = 1.0
    max_concurrent_groups: int = 64
    on_group: Callable[[list[EpisodeResult]], None] | None = None


@dataclass
class EvalOutcome:
    """What an evaluation produced: every episode, the summary, the verdict and the time taken.

    `status` is `failed` when at least half the episodes errored (`headline` says so),
    `finished_with_errors` when some did, else `finished`. `skipped_lines` counts malformed
    lines of a resumed results file that were left out.
    """

    episodes: list[EpisodeResult]
    summary: Summary
    seconds: float
    status: Status
    headline: str
    skipped_lines: int = 0


async def run_eval(job: EvalJob) -> EvalOutcome:
    """Run `job` to the end and keep `metadata.json` true whatever happens (see the module doc)."""
    results = job.output / "results.jsonl" if job.output else None
    done, skipped = load_results(results, repair=True) if job.resume and results else ([], 0)
    if results and not job.resume:
        results.unlink(missing_ok=True)
    metadata = {**job.metadata, "status": "running"}
    _write(job, metadata)
    try:
        episodes, seconds = await evaluate(
            job.env, job.engine, job.tasks, rollouts_per_task=job.rollouts_per_task,
            renderer=job.renderer, config=job.config, results_path=results, done=done,
            max_concurrent_groups=job.max_concurrent_groups, on_group=job.on_group,
        )  # fmt: skip
    except BaseException as exc:  # Ctrl-C or a bug: say so in the metadata, keep the results
        metadata.update(
            status="interrupted" if isinstance(exc, KeyboardInterrupt) else "crashed",
            error=f"{type(exc).__name__}: {exc}",
            resume_hint="finished groups are kept in results.jsonl; rerun with --resume",
        )
        _write(job, metadata)
        raise
    summary = summarize(
        episodes, rollouts_per_task=job.rollouts_per_task, generate_seconds=seconds,
        pass_threshold=job.pass_threshold,
    )  # fmt: skip
    headline, failed = error_headline(summary)
    status: Status = "failed" if failed else "finished_with_errors" if headline else "finished"
    metadata.update(status=status, summary=summary, seconds=seconds)
    _write(job, metadata)
    return EvalOutcome(episodes, summary, seconds, status, headline, skipped)


def _write(job: EvalJob, metadata: dict[str, Any]) -> None:
    if job.output is not None:
        job.output.mkdir(parents=True, exist_ok=True)
        write_metadata(job.output / "metadata.json", metadata)


@dataclass
class EvalConfig:
    """What `looprl eval` runs: its command-line flags, typed (see `looprl eval --help`)."""

    env: str
    output: Path
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    model: str = "tiny"
    base_url: str | None = None
    api_key: str | None = None
    num_tasks: int = 50
    rollouts: int = 4
    split: str = "eval"
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int | None = None
    seed: int = 0
    pass_threshold: float = 1.0
    concurrency: int = 64
    resume: bool = False
    engine: EngineSection = field(default_factory=EngineSection)


def eval_job(cfg: EvalConfig, env: Environment | None = None) -> EvalJob:
    """Load the environment (unless given) and the model or server named by `cfg`; the job."""
    from looprl.engines.factory import make_policy
    from looprl.envs.registry import load_environment

    env = env or load_environment(cfg.env, **cfg.env_kwargs)
    tasks = env.get_tasks(cfg.split, cfg.num_tasks, seed=cfg.seed)
    sampling = SamplingParams(
        max_tokens=cfg.max_tokens or env.limits.max_tokens_per_turn, temperature=cfg.temperature,
        top_p=cfg.top_p, top_k=cfg.top_k, seed=cfg.seed,
    )  # fmt: skip
    policy = make_policy(
        cfg.model, base_url=cfg.base_url, api_key=cfg.api_key, seed=cfg.seed,
        # every rollout of every group in flight may wait on the server at once
        max_concurrency=cfg.concurrency * cfg.rollouts, engine=cfg.engine,
        max_model_len=env.limits.max_context_tokens,
    )  # fmt: skip
    metadata = {
        "kind": "eval", "env": cfg.env, "env_kwargs": cfg.env_kwargs, "model": cfg.model,
        "base_url": cfg.base_url, "engine": cfg.engine.kind, "sampling": sampling.to_dict(),
        "num_tasks": len(tasks),
        "rollouts_per_task": cfg.rollouts, "split": cfg.split, "seed": cfg.seed,
    }  # fmt: skip
    return EvalJob(
        env=env, engine=policy.engine, tasks=tasks, rollouts_per_task=cfg.rollouts,
        renderer=Renderer(policy.tokenizer) if policy.tokenizer is not None else None,
        config=RolloutConfig(sampling=sampling, seed=cfg.seed), output=cfg.output,
        metadata=metadata, resume=cfg.resume, pass_threshold=cfg.pass_threshold,
        max_concurrent_groups=cfg.concurrency,
    )  # fmt: skip


def evaluate_and_report(cfg: EvalConfig, env: Environment | None = None) -> EvalOutcome:
    """`looprl eval`'s run: a progress bar, then the summary table, the verdict and the paths."""
    from looprl.console import print_summary

    job = eval_job(cfg, env)
    console.print(
        f"[bold]looprl eval[/bold] {job.env.name} · model {cfg.model} · "
        f"{len(job.tasks)} tasks x {cfg.rollouts} rollouts → {cfg.output}"
    )
    outcome = asyncio.run(_with_progress(job))
    if outcome.skipped_lines:
        console.print(
            f"[yellow]skipped {outcome.skipped_lines} malformed line(s) of results.jsonl[/]"
        )
    print_summary(outcome.summary, title=f"{job.env.name} · {cfg.model}")
    if outcome.headline:
        style = "bold red" if outcome.status == "failed" else "yellow"
        console.print(f"[{style}]{outcome.headline}[/]", highlight=False)
    console.print(
        f"results: {cfg.output / 'results.jsonl'}\nmetadata: {cfg.output / 'metadata.json'}"
    )
    return outcome


async def _with_progress(job: EvalJob) -> EvalOutcome:
    """Run the job under a progress bar (episodes done, running reward); close the engine after."""
    from looprl.console import progress_bar

    total = len(job.tasks) * job.rollouts_per_task
    rewards: list[float] = []
    with progress_bar() as bar:
        task_id = bar.add_task("episodes", total=total, info="")

        def on_group(group: list[EpisodeResult]) -> None:
            rewards.extend(ep.reward for ep in group)
            bar.update(
                task_id, advance=len(group), info=f"reward {sum(rewards) / len(rewards):.3f}"
            )

        job.on_group = on_group
        try:
            outcome = await run_eval(job)
        finally:
            await job.engine.close()
        bar.update(task_id, completed=total)  # a resumed run counts the kept episodes too
    return outcome
