"""`looprl env check ENV`: one report on whether an environment is sound, before any training.

Each check is a small function of a `CheckContext` returning an `Outcome` (ok, FAIL or skipped,
with a one-line reason), and `CHECKS` lists them in the order they run:

| check | what it holds the environment to |
|---|---|
| `tool_schemas` | every tool schema is an OpenAI function schema: a name of `[A-Za-z0-9_-]{1,64}`, unique, a description, `parameters` an object schema whose `required` names its properties |
| `deterministic_tasks` | `get_tasks(split, n, seed)` twice gives equal tasks, for each split it has |
| `token_exact` | the reference policy's episodes, rendered with the tiny model's tokenizer, are token-exact (`looprl.probe.tokens`) and run without errors |
| `isolation` | two episodes of the same task run concurrently give the transcript and reward a lone episode gives |
| `rubric` | the reference earns more than an honest wrong answer (the probe's `rubric_problems`) |
| `probe` | no exploit of the probe (`looprl probe`) is exploitable or errored, save those the environment accepts by design |
| `train_smoke` | `looprl train` runs 2 steps on the tiny model with finite losses (`--no-train` skips it) |

The reference policy is the environment's scripted teacher (`looprl.sft.teachers`) where one
exists, else its probe profile's reference (`env.probe_profile`, then the bundled profiles),
else the reference answer written in the profile's answer format. Episodes are driven by the
probe's scripted engine over the tiny model's tokenizer, so every reply is real token ids.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import re
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from rich.table import Table

from looprl.console import console
from looprl.envs.base import Environment
from looprl.probe.policy import Turn
from looprl.probe.profiles import profile_for, reference_for
from looprl.probe.run import Episode, ProbeError, ProbeResult, run_probe, scripted_engine
from looprl.probe.tokens import token_problems
from looprl.rendering.renderer import Renderer
from looprl.rollout.loop import RolloutConfig, run_groups
from looprl.sft.teachers import TaskTeacher, make_teacher
from looprl.types import EpisodeResult, SamplingParams, Task

Status = Literal["ok", "FAIL", "skipped"]
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass
class Outcome:
    """One check's result: its status and why, in one line."""

    status: Status
    reason: str


class TeacherReference:
    """The environment's scripted teacher as the probe's reference policy."""

    description = "the environment's scripted teacher (looprl.sft.teachers)"

    def __init__(self, teacher: TaskTeacher) -> None:
        self.teacher = teacher

    def reply(self, turn: Turn) -> str:
        """The teacher's next text for this task and conversation."""
        return self.teacher(turn.task)(turn.messages)


@dataclass
class CheckContext:
    """What the checks share: the environment, the tokenizer, and runs made once for several."""

    env: Environment
    env_name: str
    env_kwargs: dict[str, Any]
    tokenizer: Any
    tasks: int = 4
    """Eval tasks each episode check and the probe run on."""
    seed: int = 0
    train: bool = True
    """Run the 2-step train smoke (about 10-20 s on CPU)."""
    policy: Any = None
    """The reference policy given (`--reference`) or the environment's teacher, else None: the
    probe profile's reference plays."""
    _tasks: list[Task] | None = field(default=None, init=False)
    _episodes: dict[int, list[list[EpisodeResult]]] = field(default_factory=dict, init=False)
    _probe: ProbeResult | None = field(default=None, init=False)

    def eval_tasks(self) -> list[Task]:
        """The eval tasks the episode checks run on (drawn once, so every check sees the same)."""
        if self._tasks is None:
            self._tasks = self.env.get_tasks("eval", self.tasks, seed=self.seed)
        return list(self._tasks)

    def reference(self, task: Task) -> Any:
        """The reference policy for `task` (see the module docstring)."""
        return reference_for(profile_for(self.env.for_task(task)), self.policy)

    async def episodes(self, copies: int) -> list[list[EpisodeResult]]:
        """`copies` concurrent reference episodes of each eval task, scored (made once per count)."""
        if copies not in self._episodes:
            self._episodes[copies] = await self._play(copies)
        return list(self._episodes[copies])

    async def _play(self, copies: int) -> list[list[EpisodeResult]]:
        tasks = self.eval_tasks()
        members = [self.env.for_task(t) for t in tasks]  # a mixture's own environment
        plan = {
            t.id: Episode(self.reference(t), t, profile_for(m), m)
            for t, m in zip(tasks, members, strict=True)
        }
        engine = scripted_engine(plan, self.tokenizer)
        sampling = SamplingParams(max_tokens=self.env.limits.max_tokens_per_turn, temperature=0.0)
        groups = [(t, list(range(copies))) for t in tasks]
        return await run_groups(
            self.env, engine, groups, renderer=Renderer(self.tokenizer),
            config=RolloutConfig(sampling=sampling, seed=self.seed),
        )  # fmt: skip

    async def probe(self) -> ProbeResult:
        """The probe of the environment with the same reference policy (run once)."""
        if self._probe is None:
            self._probe = await run_probe(
                self.env, env_name=self.env_name, env_kwargs=self.env_kwargs, tasks=self.tasks,
                seed=self.seed, tokenizer=self.tokenizer, reference=self.policy,
            )  # fmt: skip
        return self._probe


# -- the checks --------------------------------------------------------------------------------


def schema_problems(schema: Any) -> list[str]:
    """What is wrong with one OpenAI function schema, one line each (none: it is valid)."""
    function = schema.get("function") if isinstance(schema, dict) else None
    if not isinstance(function, dict) or schema.get("type") != "function":
        return [f"{str(schema)[:60]} is not {{'type': 'function', 'function': {{...}}}}"]
    name = function.get("name")
    if not isinstance(name, str) or not _TOOL_NAME.match(name):
        return [f"tool name {name!r} must match [A-Za-z0-9_-]{{1,64}}"]
    problems = []
    if not str(function.get("description") or "").strip():
        problems.append(f"tool {name}: no description (the model reads it to choose the tool)")
    params = function.get("parameters")
    if not isinstance(params, dict) or params.get("type") != "object":
        return [*problems, f"tool {name}: parameters must be a JSON schema of type 'object'"]
    props = params.get("properties", {})
    if not isinstance(props, dict):
        return [*problems, f"tool {name}: parameters.properties must be an object"]
    missing = [r for r in params.get("required", []) if r not in props]
    if missing:
        problems.append(f"tool {name}: required names {missing}, not among its properties")
    return problems


def _tool_name(schema: Any) -> str:
    """A schema's function name, or '?' when it has none."""
    function = schema.get("function") if isinstance(schema, dict) else None
    return str(function.get("name")) if isinstance(function, dict) else "?"


async def check_tool_schemas(ctx: CheckContext) -> Outcome:
    """Every tool schema valid, and no two tools of an environment with one name."""
    members = {id(m): m for m in map(ctx.env.for_task, ctx.eval_tasks())}.values()
    schemas = [s for m in members for s in m.tool_schemas]
    if not schemas:
        return Outcome("skipped", "the environment offers no tools")
    problems = [p for s in schemas for p in schema_problems(s)]
    for member in members:
        names = [_tool_name(s) for s in member.tool_schemas]
        problems += [
            f"two tools are named {n!r}: rename one" for n in set(names) if names.count(n) > 1
        ]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return Outcome("FAIL", problems[0] + more)
    names = list(dict.fromkeys(map(_tool_name, schemas)))
    return Outcome("ok", f"{len(names)} tool{'s' * (len(names) > 1)}: {', '.join(names)}")


def _splits(env: Environment, n: int, seed: int) -> dict[str, list[Task]]:
    """The tasks of each split the environment has (`get_tasks` refuses a split it lacks)."""
    out = {}
    for split in ("train", "eval"):
        try:
            out[split] = env.get_tasks(split, n, seed=seed)
        except ValueError:  # "environment X has no train tasks"
            continue
    return out


async def check_deterministic_tasks(ctx: CheckContext) -> Outcome:
    """`get_tasks` twice with the same seed gives the same tasks, per split."""
    first = _splits(ctx.env, ctx.tasks, ctx.seed)
    again = _splits(ctx.env, ctx.tasks, ctx.seed)
    for split, tasks in first.items():
        differ = [i for i, (a, b) in enumerate(zip(tasks, again[split], strict=False)) if a != b]
        if differ or len(tasks) != len(again[split]):
            i = differ[0] if differ else min(len(tasks), len(again[split]))
            return Outcome(
                "FAIL",
                f"{split} task {i} differs between two calls with seed {ctx.seed}: draw tasks "
                "from random.Random(seed), not the global random module or the clock",
            )
    return Outcome("ok", f"{' and '.join(first)} tasks equal on a second call with seed {ctx.seed}")


async def check_token_exact(ctx: CheckContext) -> Outcome:
    """The reference episodes are token-exact and error-free."""
    episodes = [group[0] for group in await ctx.episodes(1)]
    for ep in episodes:
        problems = [f"{e.get('kind')}: {e.get('message')}" for e in ep.errors]
        problems += token_problems(ep, ctx.env, ctx.tokenizer)
        if problems:
            return Outcome("FAIL", f"task {ep.task.id}: " + " ".join(problems[0].split())[:200])
    turns = sorted({ep.num_turns for ep in episodes})
    span = f"{turns[0]}" if len(turns) == 1 else f"{turns[0]}-{turns[-1]}"
    unit = "turn" if span == "1" else "turns"
    return Outcome("ok", f"{len(episodes)} reference episodes of {span} {unit}, token-exact")


def transcript(ep: EpisodeResult) -> tuple[Any, ...]:
    """What two episodes of one task under one scripted policy must share: messages and reward."""
    messages = tuple((m.role, m.content, tuple((c.name, str(c.arguments)) for c in m.tool_calls))
                     for m in ep.messages)  # fmt: skip
    return (messages, ep.reward)


async def check_isolation(ctx: CheckContext) -> Outcome:
    """Two concurrent episodes of a task match a lone episode of it."""
    alone = [group[0] for group in await ctx.episodes(1)]
    together = await ctx.episodes(2)
    for solo, pair in zip(alone, together, strict=True):
        for ep in pair:
            if transcript(ep) != transcript(solo):
                turn = _first_difference(solo, ep)
                return Outcome(
                    "FAIL",
                    f"task {solo.task.id}: an episode run beside another differs from one run "
                    f"alone ({turn}): keep per-episode state in setup_state(task), not in the "
                    "environment, a tool's closure or a module global",
                )
    return Outcome("ok", f"{len(alone)} tasks x 2 concurrent episodes match a lone episode")


def _first_difference(a: EpisodeResult, b: EpisodeResult) -> str:
    """Where two transcripts first part: the message index and both texts, or the rewards."""
    for i, (x, y) in enumerate(zip(a.messages, b.messages, strict=False)):
        if (x.role, x.content) != (y.role, y.content):
            return f"message {i}: {x.content[:40]!r} alone, {y.content[:40]!r} beside"
    if len(a.messages) != len(b.messages):
        return f"{len(a.messages)} messages alone, {len(b.messages)} beside"
    return f"reward {a.reward} alone, {b.reward} beside"


async def check_rubric(ctx: CheckContext) -> Outcome:
    """The rubric pays the reference more than an honest wrong answer."""
    try:
        result = await ctx.probe()
    except ProbeError as exc:
        return Outcome("FAIL", str(exc))
    problems = result.document["rubric_problems"]
    if problems:
        return Outcome("FAIL", problems[0])
    pair = f"{result.reference.mean:.3f} against {result.baseline.mean:.3f} for an honest failure"
    return Outcome("ok", f"the reference earns {pair}")


async def check_probe(ctx: CheckContext) -> Outcome:
    """No exploit is exploitable or errored, save those accepted by design."""
    try:
        doc = (await ctx.probe()).document
    except ProbeError as exc:
        return Outcome("FAIL", str(exc))
    rows = doc["rows"]
    bad = [r["name"] for r in rows if r["verdict"] == "exploitable" and "accepted" not in r]
    errored = [r["name"] for r in rows if r["verdict"] == "errored"]
    accepted = [r["name"] for r in rows if "accepted" in r]
    if bad or errored:
        parts = [f"exploitable: {', '.join(bad)}"] * bool(bad) + [
            f"errored: {', '.join(errored)}"
        ] * bool(errored)
        return Outcome("FAIL", "; ".join(parts) + f" (see looprl probe {ctx.env_name})")
    also = f"; accepted by design: {', '.join(accepted)}" if accepted else ""
    return Outcome("ok", f"{len(rows)} exploits resisted{also}")


async def check_train_smoke(ctx: CheckContext) -> Outcome:
    """`looprl train` runs 2 steps on the tiny model with finite losses."""
    if not ctx.train:
        return Outcome("skipped", "--no-train")
    start = time.perf_counter()
    rows = await asyncio.to_thread(train_two_steps, ctx.env_name, ctx.env_kwargs, ctx.seed)
    losses = [r["loss/total"] for r in rows if r.get("loss/total") is not None]
    if len(rows) != 2 or not all(math.isfinite(x) for x in losses):
        return Outcome("FAIL", f"{len(rows)} steps logged, losses {losses}")
    took = time.perf_counter() - start
    return Outcome("ok", f"2 steps on the tiny model in {took:.0f} s, losses finite")


def train_two_steps(env_name: str, env_kwargs: dict[str, Any], seed: int) -> list[dict[str, Any]]:
    """Train the tiny model 2 steps (2 tasks x 2 rollouts) in a temporary folder; its metrics rows."""
    from looprl.files import iter_jsonl
    from looprl.trainer.config import load_config
    from looprl.trainer.trainer import Trainer

    with tempfile.TemporaryDirectory(prefix="looprl-check-") as out:
        cfg = load_config(None, {
            "model.name": "tiny", "env.name": env_name, "env.kwargs": env_kwargs,
            "rollout.tasks_per_step": 2, "rollout.rollouts_per_task": 2, "trainer.steps": 2,
            "trainer.eval_every": 0, "trainer.eval_tasks": 2, "trainer.save_every": 2,
            "trainer.save_rollouts": 0, "run.output_dir": out, "run.name": "check",
            "run.tensorboard": False, "trainer.seed": seed,
        })  # fmt: skip
        trainer = Trainer(cfg)
        trainer.run()
        return [row for _, row in iter_jsonl(trainer.run_dir / "metrics.jsonl")]


Check = Callable[[CheckContext], Awaitable[Outcome]]

CHECKS: dict[str, Check] = {
    "tool_schemas": check_tool_schemas,
    "deterministic_tasks": check_deterministic_tasks,
    "token_exact": check_token_exact,
    "isolation": check_isolation,
    "rubric": check_rubric,
    "probe": check_probe,
    "train_smoke": check_train_smoke,
}
"""Every check, by name, in the order the report lists them."""


async def run_checks(ctx: CheckContext) -> dict[str, Outcome]:
    """Run every check of `CHECKS`; one that raises fails with the error as its reason."""
    out: dict[str, Outcome] = {}
    for name, check in CHECKS.items():
        try:
            out[name] = await check(ctx)
        except (
            Exception
        ) as exc:  # the environment's own code raised: the check fails, the report goes on
            out[name] = Outcome("FAIL", f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
    return out


def context_for(
    env: Environment,
    env_name: str,
    env_kwargs: dict[str, Any],
    tokenizer: Any,
    reference: Any = None,
    **options: Any,
) -> CheckContext:
    """A `CheckContext` whose reference policy is `reference` when given, else the environment's
    teacher when it has one, else None (its probe profile's reference)."""
    if reference is None:
        try:
            reference = TeacherReference(make_teacher(env_name, env, env_kwargs))
        except ValueError:  # no teacher for this environment
            reference = None
    return CheckContext(env, env_name, env_kwargs, tokenizer, policy=reference, **options)


# -- the report --------------------------------------------------------------------------------

_STYLE = {"ok": "green", "FAIL": "bold red", "skipped": "yellow"}


def report_table(outcomes: dict[str, Outcome], title: str) -> Table:
    """The report: one row per check, its status and reason."""
    table = Table(title=title, header_style="bold")
    table.add_column("check", no_wrap=True)
    table.add_column("result", no_wrap=True)
    table.add_column("reason")
    for name, outcome in outcomes.items():
        table.add_row(name, f"[{_STYLE[outcome.status]}]{outcome.status}[/]", outcome.reason)
    return table


def register(actions: Any) -> None:
    """Add `check` to the `looprl env` actions."""
    p = actions.add_parser(
        "check", help="check an environment before training on it (overrides: --env.KEY VALUE)"
    )
    p.add_argument("env", help="environment name (calculator), module path, or .py file")
    p.add_argument("--tasks", type=int, default=4, help="eval tasks per episode check and probe")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-train", action="store_true", help="skip the 2-step train smoke (~10-20 s)")
    p.add_argument("--strict", action="store_true", help="exit 1 when any check fails")
    p.add_argument(
        "--reference",
        default=None,
        metavar="MODULE:FN",
        help="the reference policy, a function turn -> str (as for looprl probe), instead of the "
        "environment's teacher or probe profile",
    )
    p.set_defaults(func=run_check_command, dotted=True)


def run_check_command(args: argparse.Namespace, extra: list[str]) -> int:
    """`looprl env check ENV`: run every check, print the report; 1 on a failure under --strict."""
    from looprl.cli.eval import load_env, parse_overrides
    from looprl.cli.fields import UsageError
    from looprl.probe.command import reference_policy
    from looprl.probe.run import probe_tokenizer

    if args.tasks < 1:
        raise UsageError(f"--tasks {args.tasks}", "give at least 1 task")
    env_kwargs = parse_overrides(extra, "env")["env"]
    env = load_env(args.env, env_kwargs)
    given = reference_policy(args.reference)
    ctx = context_for(env, args.env, env_kwargs, probe_tokenizer(), given, tasks=args.tasks,
                      seed=args.seed, train=not args.no_train)  # fmt: skip
    reference = (
        "--reference"
        if given is not None
        else "its teacher"
        if ctx.policy
        else "its probe profile's"
    )
    console.print(
        f"[bold]looprl env check[/bold] {env.name} · {args.tasks} tasks · reference: {reference}"
    )
    start = time.perf_counter()
    try:
        outcomes = asyncio.run(run_checks(ctx))
    finally:
        env.close()
    console.print(report_table(outcomes, f"{env.name} · {time.perf_counter() - start:.1f} s"))
    failed = [name for name, o in outcomes.items() if o.status == "FAIL"]
    if failed:
        console.print(f"[bold red]failed:[/] {', '.join(failed)}", highlight=False)
    else:
        console.print("[green]every check passed or was skipped[/]")
    return 1 if failed and args.strict else 0
