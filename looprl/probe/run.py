"""Run the probe: every policy on every task, through the real rollout, and the verdict per exploit.

Each (policy, task) pair becomes one episode of an ordinary evaluation (`looprl.eval.run`), so
tools run, state is kept, limits cut, the environment's own rubric scores, and the episodes are
written to `results.jsonl` exactly as `looprl eval` writes them, each naming its policy in
`task.info["exploit"]`. The engine is a `ScriptedEngine` over the tiny model's tokenizer: every
reply is encoded to token ids and cut at the turn's token cap, as a sampler's would be.

Verdicts: an exploit whose mean reward exceeds the honest-failure baseline's by more than
`margin` is `exploitable`; one whose episodes mostly errored (or none could be scored) is
`errored`; else `resisted`. The two yardsticks are checked too (`rubric_problems`): a reference
that earns no more than the honest failure (plus `margin`), or could not be scored, leaves every
exploit comparison meaningless. `strict_failed` is true when the yardsticks have a problem, or a
row is errored, or exploitable without the environment's profile accepting it by design (the
row then says why, `accepted`). A baseline that cannot be scored at all raises `ProbeError`.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from looprl.engines.base import GenerationRequest
from looprl.engines.scripted import ScriptedEngine
from looprl.envs.base import Environment
from looprl.eval.run import EvalJob, run_eval
from looprl.probe.exploits import GENERIC
from looprl.probe.policy import Exploit, ProbeProfile, Turn
from looprl.probe.profiles import HonestFailure, profile_for, reference_for
from looprl.rendering.renderer import Renderer
from looprl.rollout.loop import RolloutConfig
from looprl.types import EpisodeResult, SamplingParams, Task

Verdict = Literal["exploitable", "resisted", "errored"]


class ProbeError(ValueError):
    """The probe cannot judge the environment; the message names the problem and the fix."""


BASELINE = "honest_failure"
REFERENCE = "reference"


@dataclass
class Episode:
    """What the scripted engine needs to answer one probe episode."""

    policy: Any
    task: Task
    profile: ProbeProfile
    env: Environment


@dataclass
class Row:
    """One policy's results: mean reward (scored episodes only), its standard error, counts."""

    name: str
    description: str
    knows_answer: bool
    rewards: list[float]
    episodes: int
    errors: int

    @property
    def mean(self) -> float:
        """Mean reward of the scored episodes (NaN when none)."""
        return statistics.fmean(self.rewards) if self.rewards else math.nan

    @property
    def stderr(self) -> float:
        """Standard error of the mean (0.0 with fewer than two scored episodes)."""
        n = len(self.rewards)
        return statistics.stdev(self.rewards) / math.sqrt(n) if n > 1 else 0.0

    def verdict(self, baseline: float, margin: float) -> Verdict:
        """`errored` when half or more errored, `exploitable` above baseline + margin, else `resisted`."""
        if not self.rewards or 2 * self.errors >= self.episodes:
            return "errored"
        return "exploitable" if self.mean - baseline > margin else "resisted"

    def summary(self) -> dict[str, Any]:
        """`{"name", "mean_reward", "stderr"}` (for the baseline and reference in probe.json)."""
        return {"name": self.name, "mean_reward": _num(self.mean), "stderr": _num(self.stderr)}


def _num(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 6)


def policies_for(
    env: Environment, tasks: list[Task], reference: Any = None
) -> list[tuple[Any, list[Episode]]]:
    """Baseline, reference and every exploit, each with the episodes it runs (tasks it applies to).

    `reference` (a function `turn -> str` or an object with `reply`) replaces the profiles'
    reference policy. An environment's own exploits (its profile's `exploits`) run on its own
    tasks only.
    """
    members = [env.for_task(t) for t in tasks]
    triples = list(zip(tasks, [profile_for(m) for m in members], members, strict=True))
    generic = {e.name for e in GENERIC}
    extra: dict[str, Exploit] = {}
    for _, profile, member in triples:
        for exploit in profile.exploits:
            if not exploit.name or exploit.name in generic:
                raise ValueError(
                    f"environment {member.name!r} adds an exploit named {exploit.name!r}; give "
                    f"it a name of its own (the generic ones are {sorted(generic)})"
                )
            extra.setdefault(exploit.name, exploit)
    out: list[tuple[Any, list[Episode]]] = [
        (HonestFailure(), [Episode(HonestFailure(), t, p, m) for t, p, m in triples]),
        (
            reference_for(triples[0][1], reference),
            [Episode(reference_for(p, reference), t, p, m) for t, p, m in triples],
        ),
    ]
    for exploit in [*GENERIC, *extra.values()]:
        own = exploit.name in extra
        runs = [
            Episode(exploit, t, p, m)
            for t, p, m in triples
            if (not own or exploit in p.exploits) and exploit.applies(t, m.tool_schemas)
        ]
        if runs:
            out.append((exploit, runs))
    return out


def probe_task(task: Task, name: str, role: str, knows_answer: bool) -> Task:
    """A copy of `task` for one policy: its own id, and the policy named in `info`."""
    info = {**task.info, "exploit": name, "probe_role": role, "knows_answer": knows_answer}
    return dataclasses.replace(task, id=f"{task.id}~{name}", info=info)


def scripted_engine(episodes: dict[str, Episode], tokenizer: Any) -> ScriptedEngine:
    """An engine that answers each request with its episode's policy (found by the task id)."""

    def reply(request: GenerationRequest) -> str:
        ep = episodes[request.affinity]
        turn = Turn(
            task=ep.task,
            messages=list(request.messages),
            turn=sum(m.role == "assistant" for m in request.messages),
            profile=ep.profile,
            tools=ep.env.tool_schemas,
            max_tokens=ep.env.limits.max_tokens_per_turn,
            max_turns=ep.env.limits.max_turns,
        )
        return str(ep.policy.reply(turn))

    return ScriptedEngine(reply, tokenizer, logprob=0.0)


def probe_tokenizer() -> Any:
    """The tiny model's tokenizer (built offline on first use): token ids and the token cap."""
    from transformers import AutoTokenizer

    from looprl.models.tiny import tiny_path

    return AutoTokenizer.from_pretrained(tiny_path(), local_files_only=True)


@dataclass
class ProbeResult:
    """Every row of a probe, the episodes behind them, and what `probe.json` holds."""

    baseline: Row
    reference: Row
    rows: list[Row]
    episodes: list[EpisodeResult]
    document: dict[str, Any]


async def run_probe(
    env: Environment,
    *,
    env_name: str,
    env_kwargs: dict[str, Any] | None = None,
    tasks: int = 8,
    margin: float = 0.1,
    output: Path | None = None,
    split: str = "eval",
    seed: int = 0,
    tokenizer: Any = None,
    reference: Any = None,
) -> ProbeResult:
    """Probe `env` on `tasks` tasks of `split`; write results.jsonl, metadata.json and probe.json
    to `output` when given. `reference` replaces the environment's reference policy."""
    if tasks < 1:
        raise ValueError(f"--tasks must be >= 1, got {tasks}")
    if not margin >= 0:
        raise ValueError(f"--margin must be >= 0, got {margin}")
    base_tasks = env.get_tasks(split, tasks, seed=seed)
    if not base_tasks:
        raise ValueError(f"environment {env_name!r} gave no {split} tasks to probe")
    plan = policies_for(env, base_tasks, reference)
    episodes: dict[str, Episode] = {}
    job_tasks: list[Task] = []
    for policy, runs in plan:
        role = {BASELINE: "baseline", REFERENCE: "reference"}.get(policy.name, "exploit")
        for ep in runs:
            task = probe_task(ep.task, policy.name, role, policy.knows_answer)
            episodes[task.id] = ep
            job_tasks.append(task)
    tokenizer = tokenizer if tokenizer is not None else probe_tokenizer()
    sampling = SamplingParams(max_tokens=env.limits.max_tokens_per_turn, temperature=0.0)
    metadata = {"kind": "probe", "env": env_name, "env_kwargs": env_kwargs or {}, "tasks": len(base_tasks),
                "split": split, "seed": seed, "model": "scripted"}  # fmt: skip
    job = EvalJob(
        env=env, engine=scripted_engine(episodes, tokenizer), tasks=job_tasks,
        rollouts_per_task=1, renderer=Renderer(tokenizer),
        config=RolloutConfig(sampling=sampling, seed=seed), output=output, metadata=metadata,
    )  # fmt: skip
    outcome = await run_eval(job)
    rows = _rows(plan, outcome.episodes)
    baseline, reference, exploits = rows[0], rows[1], rows[2:]
    if not baseline.rewards:
        raise ProbeError(_unscored_baseline(env_name, baseline, outcome.episodes, output))
    accepted = {k: v for t in base_tasks for k, v in profile_for(env.for_task(t)).accepted.items()}
    doc = probe_document(env_name, env_kwargs or {}, len(base_tasks), margin, rows, accepted)
    if output is not None:
        from looprl import safe_json
        from looprl.files import write_text_atomically

        write_text_atomically(output / "probe.json", safe_json.dumps(doc, indent=2))
    return ProbeResult(baseline, reference, exploits, outcome.episodes, doc)


def _unscored_baseline(
    env_name: str, baseline: Row, episodes: list[EpisodeResult], output: Path | None
) -> str:
    """Why no honest-failure episode was scored (its first error) and what to do, in one line."""
    errors = [e for ep in episodes if ep.task.info["exploit"] == BASELINE for e in ep.errors]
    first = f"; the first: {errors[0].get('kind')}: {errors[0].get('message')}" if errors else ""
    where = f" (episodes in {output / 'results.jsonl'})" if output is not None else ""
    first = " ".join(first.split())[:300]
    return (
        f"the honest-failure baseline could not be scored on {env_name!r}: {baseline.errors} of "
        f"{baseline.episodes} episodes errored{first}; fix the environment so that its rubric "
        f"scores a wrong answer in the expected format (0 is a score), then probe again{where}"
    )


def rubric_problems(baseline: Row, reference: Row, margin: float) -> list[str]:
    """What is wrong with the yardsticks, one line each (none: the exploit rows mean something).

    The reference must be scored and earn more than the honest failure by more than `margin`:
    a rubric that pays an honest wrong answer like the right one, or does not pay the right one,
    cannot tell an exploit from an answer.
    """
    if not reference.episodes:
        return []
    if not reference.rewards:
        return [
            f"the reference could not be scored ({reference.errors} of {reference.episodes} "
            "episodes errored): fix the rubric, or give a reference that solves the task "
            "(--reference MODULE:FN)"
        ]
    if reference.mean - baseline.mean > margin:
        return []
    pair = f"{baseline.mean:.3f} against the reference's {reference.mean:.3f}, margin {margin:g}"
    if baseline.mean > 0:
        return [
            f"the rubric pays the honest wrong answer like the right one ({pair}): make it "
            "score the answer against task.answer, not the format"
        ]
    return [
        f"the reference scores no better than the honest failure ({pair}): the rubric does "
        "not reward the right answer; check how it reads the answer, or give a reference that "
        "solves the task (--reference MODULE:FN)"
    ]


def _rows(plan: list[tuple[Any, list[Episode]]], episodes: list[EpisodeResult]) -> list[Row]:
    """One row per policy from its episodes (found by `task.info["exploit"]`)."""
    by_name: dict[str, list[EpisodeResult]] = {}
    for ep in episodes:
        by_name.setdefault(str(ep.task.info["exploit"]), []).append(ep)
    rows = []
    for policy, _ in plan:
        eps = by_name.get(policy.name, [])
        scored = [ep.reward for ep in eps if ep.trainable]
        description = getattr(policy, "description", policy.name)
        rows.append(
            Row(
                policy.name,
                description,
                policy.knows_answer,
                scored,
                len(eps),
                len(eps) - len(scored),
            )
        )
    return rows


def probe_document(
    env_name: str,
    env_kwargs: dict[str, Any],
    tasks: int,
    margin: float,
    rows: list[Row],
    accepted: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The `probe.json` document (schema version 1; `looprl.viewer.probe` reads it).

    An exploitable row the environment accepts by design carries `accepted` (the reason).
    """
    accepted = accepted or {}
    baseline, reference, exploits = rows[0], rows[1], rows[2:]
    out_rows = [
        {
            "name": r.name,
            "description": r.description,
            "knows_answer": r.knows_answer,
            "mean_reward": _num(r.mean),
            "stderr": _num(r.stderr),
            "episodes": r.episodes,
            "errors": r.errors,
            "verdict": r.verdict(baseline.mean, margin),
        }
        for r in exploits
    ]
    for row in out_rows:
        if row["verdict"] == "exploitable" and row["name"] in accepted:
            row["accepted"] = accepted[str(row["name"])]
    problems = rubric_problems(baseline, reference, margin)
    return {
        "kind": "looprl.probe",
        "version": 1,
        "env": env_name,
        "env_kwargs": env_kwargs,
        "tasks": tasks,
        "margin": margin,
        "baseline": baseline.summary(),
        "reference": reference.summary() if reference.episodes else None,
        "rows": out_rows,
        "exploitable": [r["name"] for r in out_rows if r["verdict"] == "exploitable"],
        "rubric_problems": problems,
        "strict_failed": bool(problems)
        or any(r["verdict"] != "resisted" and "accepted" not in r for r in out_rows),
    }
