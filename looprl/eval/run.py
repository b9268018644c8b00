"""One evaluation path for `looprl eval`, the demo and the trainer's held-out evaluations.

`run_eval(job)` runs an `EvalJob` (an environment, an engine and its tasks) to the end: results
streamed to `results.jsonl`, resume, the summary, the verdict on errored episodes, and
`metadata.json` kept true at every exit (running, finished, failed, crashed, interrupted), and
`summary.json` at the end. The trainer builds its job from what it already holds; `eval_job(cfg)`
builds one from names (the command line's flags, typed as `EvalConfig`); `evaluate_and_report(cfg)`
adds the progress (a bar on a terminal, plain lines in a log) and the printed table that
`looprl eval` and the demo show.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from looprl import safe_json
from looprl.console import console
from looprl.engines.base import Engine
from looprl.engines.config import EngineSection
from looprl.envs.base import Environment
from looprl.eval.summary import (
    Summary,
    error_headline,
    evaluate,
    load_results,
    summarize,
    write_metadata,
)
from looprl.files import import_module_or_file, write_text_atomically
from looprl.rendering.formats import ParserName
from looprl.rendering.renderer import Renderer
from looprl.rendering.templates import check_template_choice, set_chat_template
from looprl.rollout.loop import RolloutConfig
from looprl.tools.hung import ToolsHung
from looprl.types import EpisodeResult, Message, SamplingParams, Task

Status = Literal["finished", "finished_with_errors", "failed"]
UNSCORED = "no episode could be scored"
"""How the headline of an evaluation that scored nothing begins (`verdict`)."""


@dataclass
class EvalJob:
    """An evaluation ready to run.

    `output` (a directory) receives `results.jsonl`, `metadata.json` (`metadata` is merged
    into it) and, when the evaluation ends, `summary.json` (the summary's fields with `status`
    and `seconds`); without it nothing is written. `resume` keeps the finished groups already
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
            _stopped_by(exc),
            resume_hint="finished groups are kept in results.jsonl; rerun with --resume",
        )
        _write(job, metadata)
        raise
    summary = summarize(
        episodes, rollouts_per_task=job.rollouts_per_task, generate_seconds=seconds,
        pass_threshold=job.pass_threshold,
    )  # fmt: skip
    status, headline = verdict(summary, episodes)
    metadata.update(status=status, summary=summary, seconds=seconds)
    _write(job, metadata)
    if job.output is not None:  # for scripts: the printed summary, the status, the time
        record = {"status": status, "seconds": seconds, **summary}
        write_text_atomically(job.output / "summary.json", safe_json.dumps(record, indent=2))
    return EvalOutcome(episodes, summary, seconds, status, headline, skipped)


def _stopped_by(exc: BaseException) -> dict[str, str]:
    """The metadata `status` and `error` of an evaluation that `exc` stopped."""
    # under asyncio.run, Ctrl-C reaches the running evaluation as a cancellation
    if isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError)):
        return {"status": "interrupted", "error": "interrupted (Ctrl-C)"}
    if isinstance(exc, ToolsHung):  # a stop by design, with its own one-line message
        return {"status": "failed", "error": str(exc)}
    return {"status": "crashed", "error": f"{type(exc).__name__}: {exc}"}


def verdict(summary: Summary, episodes: list[EpisodeResult]) -> tuple[Status, str]:
    """(status, headline) of a finished evaluation: `failed` when at least half the episodes
    errored (`error_headline`) or when none could be scored (`unscored`), else
    `finished_with_errors` when any errored, else `finished`."""
    headline, failed = error_headline(summary)
    if not failed and unscored(summary):
        counts = (
            [f"{summary['rollout_errors']} rollout errors"] if summary["rollout_errors"] else []
        )
        counts.append(f"{summary['scoring_errors']} scoring errors")
        return "failed", (f"{UNSCORED}: {', '.join(counts)}, first: {first_error(episodes)}")
    return ("failed" if failed else "finished_with_errors" if headline else "finished"), headline


def unscored(summary: Summary) -> bool:
    """Whether episodes ran and none of them could be scored."""
    return summary["episodes"] > 0 and summary["scored_episodes"] == 0


def _write(job: EvalJob, metadata: dict[str, Any]) -> None:
    if job.output is not None:
        job.output.mkdir(parents=True, exist_ok=True)
        write_metadata(job.output / "metadata.json", metadata)


class EvalConfig(BaseModel):
    """What `looprl eval` runs: its flags, typed and validated (see `looprl eval --help`).

    Sampling settings are checked here, before any work: a temperature below 0, a top-p outside
    (0, 1] or a max-tokens below 1 is refused with the flag's name.
    """

    model_config = ConfigDict(extra="forbid")

    env: str = Field(description="environment name (calculator), module path, or .py file")
    output: Path | None = Field(
        None, description="results directory (default: runs/eval-ENV-MODEL-TIME)"
    )
    env_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="arguments to load_environment (--env.KEY VALUE)"
    )
    model: str = Field(
        "tiny", description="tiny, smollm2-135m, a local HF directory, or a served model name"
    )
    base_url: str | None = Field(
        None, description="OpenAI-compatible server URL (then --model names the served model)"
    )
    api_key: str | None = Field(
        None,
        description="API key for --base-url; it lands in your shell history: prefer --api-key-var",
    )
    api_key_var: str | None = Field(
        None, description="name of the environment variable holding the API key (OPENAI_API_KEY)"
    )
    parser: ParserName = Field(
        "auto",
        description="tool-call format the model writes: auto (from the chat template), harmony, "
        "hermes, llama3_json, mistral or qwen3_coder (docs/models.md)",
    )
    chat_template: str | None = Field(
        None, description="a Jinja chat template file replacing the tokenizer's, or looprl"
    )
    drop_reasoning: bool = Field(
        False,
        description="past turns' <think> reasoning leaves the prompt (as Qwen3's template does); "
        "the train config's model.keep_reasoning = false",
    )
    policy: str | None = Field(
        None,
        description="MODULE:FN, a scripted policy instead of a model: FN(messages) returns the "
        "next assistant text (e.g. looprl.sft.teachers:calculator)",
    )
    save_sft: Path | None = Field(
        None,
        description="write the episodes that reach --pass-threshold as SFT traces (JSONL for "
        "looprl sft --data)",
    )
    num_tasks: int = Field(50, ge=1, description="tasks to evaluate")
    rollouts: int = Field(4, ge=1, description="rollouts per task (pass@k up to this k)")
    split: Literal["eval", "train"] = Field("eval", description="which task split to draw from")
    temperature: float = Field(1.0, ge=0, description="sampling temperature (0 = greedy)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling, in (0, 1] (1 = off)")
    top_k: int = Field(0, ge=0, description="top-k sampling (0 = off)")
    max_tokens: int | None = Field(
        None, ge=1, description="max new tokens per turn (default: the environment's)"
    )
    seed: int = Field(0, description="seed of the tasks and of sampling")
    pass_threshold: float = Field(1.0, description="reward counted as solved for pass@k")
    concurrency: int = Field(64, ge=1, description="task groups run at once")
    resume: bool = Field(
        False, description="continue an interrupted evaluation in --output (or the latest)"
    )
    engine: EngineSection = Field(default_factory=lambda: EngineSection())

    @field_validator("chat_template")
    @classmethod
    def _template_exists(cls, value: str | None) -> str | None:
        return check_template_choice(value)

    def api_key_value(self) -> str | None:
        """The API key: from the variable named by `api_key_var`, else `api_key`."""
        if self.api_key_var:
            return os.environ.get(self.api_key_var)
        return self.api_key


def eval_job(cfg: EvalConfig, env: Environment | None = None) -> EvalJob:
    """Load the environment (unless given) and the model, server or policy named by `cfg`; the job."""
    from looprl.engines.factory import make_policy
    from looprl.envs.registry import load_environment

    env = env or load_environment(cfg.env, **cfg.env_kwargs)
    tasks = env.get_tasks(cfg.split, cfg.num_tasks, seed=cfg.seed)
    sampling = SamplingParams(
        max_tokens=cfg.max_tokens or env.limits.max_tokens_per_turn, temperature=cfg.temperature,
        top_p=cfg.top_p, top_k=cfg.top_k, seed=cfg.seed,
    )  # fmt: skip
    renderer = None
    if cfg.policy:
        engine: Engine = policy_engine(load_policy(cfg.policy))
    else:
        policy = make_policy(
            cfg.model, base_url=cfg.base_url, api_key=cfg.api_key_value(), seed=cfg.seed,
            # every rollout of every group in flight may wait on the server at once
            max_concurrency=cfg.concurrency * cfg.rollouts, engine=cfg.engine,
            max_model_len=env.limits.max_context_tokens,
        )  # fmt: skip
        engine = policy.engine
        if policy.tokenizer is not None:
            set_chat_template(policy.tokenizer, cfg.chat_template)
            renderer = Renderer(
                policy.tokenizer, parser=cfg.parser, keep_reasoning=not cfg.drop_reasoning
            )
    metadata = {
        "kind": "eval", "env": cfg.env, "env_kwargs": cfg.env_kwargs,
        "model": cfg.policy or cfg.model, "base_url": cfg.base_url, "engine": cfg.engine.kind,
        "sampling": sampling.to_dict(), "num_tasks": len(tasks),
        "rollouts_per_task": cfg.rollouts, "split": cfg.split, "seed": cfg.seed,
        "parser": cfg.parser, "chat_template": cfg.chat_template,
        "drop_reasoning": cfg.drop_reasoning,
    }  # fmt: skip
    return EvalJob(
        env=env, engine=engine, tasks=tasks, rollouts_per_task=cfg.rollouts, renderer=renderer,
        config=RolloutConfig(sampling=sampling, seed=cfg.seed), output=cfg.output,
        metadata=metadata, resume=cfg.resume, pass_threshold=cfg.pass_threshold,
        max_concurrent_groups=cfg.concurrency,
    )  # fmt: skip


Policy = Callable[[list[Message]], str]
"""A scripted policy: the conversation so far -> the next assistant text (see looprl.sft.teachers)."""


def load_policy(spec: str, flag: str = "--policy") -> Policy:
    """Import `MODULE:FN` (a module path or a .py file before the colon); ValueError says why not
    (naming `flag`, the option that gave `spec`)."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{flag} {spec!r} is not MODULE:FN; write it as my_module:my_policy")
    try:
        module = import_module_or_file(module_name)
    except (FileNotFoundError, ModuleNotFoundError) as exc:
        raise ValueError(
            f"{flag} {spec!r}: cannot import {module_name!r} ({exc}); give an importable module "
            "or a .py file"
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        names = sorted(
            n for n in vars(module) if callable(vars(module)[n]) and not n.startswith("_")
        )
        raise ValueError(
            f"{flag} {spec!r}: {module_name} has no function {attr!r}; it has {names[:12]}"
        )
    return fn  # type: ignore[no-any-return]


def policy_engine(policy: Policy) -> Engine:
    """A message-level engine that answers each request with `policy(messages)`.

    An exception of the policy becomes that episode's error, as a failed request would.
    """
    from looprl.engines.scripted import ScriptedEngine

    return ScriptedEngine(lambda request: policy(request.messages))


def evaluate_and_report(cfg: EvalConfig, env: Environment | None = None) -> EvalOutcome:
    """`looprl eval`'s run: a progress bar, then the summary table, the verdict and the paths."""
    from looprl.console import print_summary

    if cfg.output is None:
        raise ValueError("evaluate_and_report needs cfg.output, the results directory")
    output = cfg.output
    job = eval_job(cfg, env)
    console.print(
        f"[bold]looprl eval[/bold] {job.env.name} · model {cfg.policy or cfg.model} · "
        f"{len(job.tasks)} tasks x {cfg.rollouts} rollouts → {output}"
    )
    outcome = asyncio.run(_with_progress(job))
    if outcome.skipped_lines:
        console.print(
            f"[yellow]skipped {outcome.skipped_lines} malformed line(s) of results.jsonl[/]"
        )
    print_summary(outcome.summary, title=f"{job.env.name} · {cfg.policy or cfg.model}")
    if outcome.headline:
        style = "bold red" if outcome.status == "failed" else "yellow"
        console.print(f"[{style}]{outcome.headline}[/]", highlight=False)
    if outcome.status == "failed":  # the reason in full: the summary's list cuts long messages
        console.print(
            f"first error: {first_error(outcome.episodes)}", highlight=False, soft_wrap=True
        )
    if cfg.save_sft is not None:
        save_sft_traces(job.env, outcome.episodes, cfg.save_sft, cfg.pass_threshold)
    console.print(
        f"results: {output / 'results.jsonl'}\nmetadata: {output / 'metadata.json'}\n"
        f"summary: {output / 'summary.json'}"
    )
    return outcome


def first_error(episodes: list[EpisodeResult]) -> str:
    """The first recorded error of `episodes`, whole (kind, where, message); empty when none."""
    for ep in episodes:
        for err in ep.errors:
            where = f" in {err['function']}" if err.get("function") else ""
            return f"{err.get('kind')}{where}: {err.get('message', '')}"
    return ""


def save_sft_traces(
    env: Environment, episodes: list[EpisodeResult], path: Path, threshold: float
) -> int:
    """Write the episodes that reached `threshold` as `looprl sft` rows (atomically); how many."""
    rows = traces_from_episodes(env, episodes, threshold)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(path, "".join(json.dumps(r) + "\n" for r in rows))
    style = "" if rows else "[yellow]"
    console.print(
        f"{style}SFT traces: {len(rows)} of {len(episodes)} episodes reached reward "
        f">= {threshold} → {path}",
        highlight=False,
    )
    return len(rows)


def solved(ep: EpisodeResult, threshold: float) -> bool:
    """An episode that ran and was scored without errors and reached reward `threshold`."""
    return not ep.errors and bool(ep.rewards) and ep.reward >= threshold - 1e-9


def traces_from_episodes(
    env: Environment, episodes: Iterable[EpisodeResult], threshold: float
) -> list[dict[str, Any]]:
    """`looprl sft` rows (messages and the task's tools) of the episodes that reached `threshold`.

    Episodes with errors are left out: a trace teaches what the model should write, so it must
    have run cleanly and been scored.
    """
    rows = []
    for ep in episodes:
        if not solved(ep, threshold):
            continue
        tools = env.for_task(ep.task).tool_schemas
        rows.append({"messages": [m.to_template() for m in ep.messages], "tools": tools})
    return rows


async def _with_progress(job: EvalJob) -> EvalOutcome:
    """Run the job showing progress (episodes done, running reward): a bar on a terminal, a line
    every tenth of the episodes or 30 s in a log; close the engine after."""
    from looprl.console import progress

    total = len(job.tasks) * job.rollouts_per_task
    rewards: list[float] = []
    with progress("eval", total) as advance:

        def on_group(group: list[EpisodeResult]) -> None:
            rewards.extend(ep.reward for ep in group)
            advance(len(group), f"reward {sum(rewards) / len(rewards):.3f}")

        job.on_group = on_group
        try:
            return await run_eval(job)
        finally:
            await job.engine.close()
            job.env.close()
