"""Environments: tasks + rubric + limits, in three ready kinds (single-turn, multi-turn, tools).

An environment never sees an engine or a trainer: the rollout (`looprl.rollout.loop`) drives it.
The hooks, all async, are:

- `setup_state(task)`: per-episode state; values here reach hidden tool arguments;
- `env_response(messages, state)`: the environment's answer to the last assistant turn (tool
  results, a game's feedback, a simulated user); an empty list ends the episode;
- `cleanup_state(state)`: release per-episode resources;
- `ensure_alive()`: restart what the run holds that died (an MCP server); run before each batch.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from looprl.envs.hints import Hint, HintFunction
from looprl.envs.user import SimulatedUser, UserFunction, as_user
from looprl.mcp import MCPServer, MCPTools
from looprl.rendering.formats import get_parser
from looprl.rendering.parser import ParsedTurn
from looprl.rubrics import Rubric
from looprl.tools.executor import Isolation, ToolExecutor, ToolResult, count_tool_errors
from looprl.tools.schema import make_tools
from looprl.tools.source import FunctionTools, ToolSource
from looprl.types import Message, Task, ToolOutcome

GENERATED_EPOCH = 1000  # tasks asked of a training-task generator per epoch

TaskSource = list[Task] | Callable[[int, int], list[Task]]


@dataclass
class Limits:
    """Per-episode limits.

    Defaults suit small models on CPU: a few tool turns, short turns, a 2k-token context (the
    tiny model's window), and a generous wall-clock cap on the environment's own time that only
    catches hung tools.
    """

    max_turns: int = 6
    """Assistant turns per episode; the last one's tool calls run but their replies are dropped."""
    max_tokens_per_turn: int = 256
    """Tokens one turn may sample; reaching it ends the episode (`max_tokens`)."""
    max_context_tokens: int = 2048
    """Tokens of the whole conversation (token-level engines; `max_context`)."""
    timeout_s: float = 300.0
    """Wall-clock seconds the environment (set-up, tools, feedback) may take per episode; past it
    the episode ends with an `infra` error. Time waiting for the model does not count."""

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_tokens_per_turn", "max_context_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"Limits.{name} must be >= 1, got {getattr(self, name)}")
        if self.timeout_s <= 0:
            raise ValueError(f"Limits.timeout_s must be > 0, got {self.timeout_s}")


@dataclass
class StepOutcome:
    """What the environment does after an assistant turn: new messages, or done.

    `infra_errors` lists faults that were not the model's (a tool that hung): the rollout records
    each on the episode as an error of kind `infra`, which keeps the episode out of training.
    `tool_outcomes` says how each call of the turn went; the rollout keeps them on the episode.
    """

    messages: list[Message] = field(default_factory=list)
    """Messages to append after the model's turn (tool replies, a user turn)."""
    done: bool = False
    """End the episode after this turn."""
    tool_errors: dict[str, int] = field(default_factory=dict)
    """Failed calls of this turn by kind."""
    num_tool_calls: int = 0
    """Tool-call blocks of this turn, malformed ones included."""
    infra_errors: list[str] = field(default_factory=list)
    """Faults that were not the model's (one message each)."""
    tool_outcomes: list[ToolOutcome] = field(default_factory=list)
    """How each call of the turn went, in order."""


def tool_step_outcome(parsed: ParsedTurn, results: list[ToolResult]) -> StepOutcome:
    """The outcome of a turn whose tool calls (and malformed calls) ran: their messages, error
    counts by kind, infrastructure errors and each call's outcome."""
    return StepOutcome(
        messages=[r.to_message() for r in results],
        tool_errors=count_tool_errors(results),
        num_tool_calls=len(parsed.calls) + len(parsed.errors),
        infra_errors=[f"tool {r.name!r}: {r.content}" for r in results if r.infra],
        tool_outcomes=[r.outcome() for r in results],
    )


class Environment:
    """Base environment: tasks per split, a rubric, limits and a tool-call parser.

    `train_tasks` and `eval_tasks` are lists of tasks or seeded generators
    `(n, seed) -> list[Task]` (the same seed gives the same tasks). `hint` is the help the
    environment may give a training task (`looprl.envs.hints`; None: none).
    """

    def __init__(
        self,
        *,
        name: str,
        rubric: Rubric,
        train_tasks: TaskSource | None = None,
        eval_tasks: TaskSource | None = None,
        limits: Limits | None = None,
        system_prompt: str | None = None,
        parser: str = "hermes",
        hint: HintFunction | None = None,
    ) -> None:
        self.name = name
        self.rubric = rubric
        self.train_tasks = train_tasks
        self.eval_tasks = eval_tasks
        self.limits = limits or Limits()
        self.system_prompt = system_prompt
        self.parser = get_parser(parser)
        self.hint_function = hint

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        """OpenAI function schemas offered to the model (none by default)."""
        return []

    def get_tasks(self, split: str = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        """`n` tasks of a split (`train` or `eval`/`test`), with the system prompt applied."""
        source = self.train_tasks if split == "train" else self.eval_tasks
        if split not in ("train", "eval", "test"):
            raise ValueError(f"unknown split {split!r}; use 'train' or 'eval'")
        if source is None:
            raise ValueError(f"environment {self.name!r} has no {split} tasks")
        if callable(source):
            tasks = source(n if n is not None else 100, seed)
        else:
            tasks = list(source) if n is None else list(source)[:n]
        return [self._prepare(t) for t in tasks]

    def iter_train_tasks(self, seed: int, start: int = 0) -> Iterator[Task]:
        """An endless, seeded stream of training tasks starting at cursor `start` (for resume).

        Generators are asked for epochs of 1000 tasks (seeded by epoch); one with a smaller
        pool (a finite dataset) gives what it has, and that count is the epoch size. A task list
        is reshuffled each epoch. The same (seed, cursor) always yields the same task.
        """
        if isinstance(self.train_tasks, list):
            if not self.train_tasks:
                raise ValueError(f"environment {self.name!r} has an empty train task list")
            cached: tuple[int, list[Task]] | None = None
            epoch_size = len(self.train_tasks)
        else:
            cached = (0, self._epoch(seed, 0, GENERATED_EPOCH))
            epoch_size = len(cached[1])
        i = start
        while True:
            epoch, offset = divmod(i, epoch_size)
            if cached is None or cached[0] != epoch:
                tasks = self._epoch(seed, epoch, epoch_size)
                if len(tasks) < epoch_size:
                    raise ValueError(
                        f"environment {self.name!r} generated {len(tasks)} training tasks for "
                        f"epoch {epoch} but {epoch_size} for epoch 0; its generator must give "
                        "the same number every epoch"
                    )
                cached = (epoch, tasks)
            yield cached[1][offset]
            i += 1

    def _epoch(self, seed: int, epoch: int, size: int) -> list[Task]:
        """Up to `size` training tasks of one epoch (raises when there are none)."""
        source = self.train_tasks
        if source is None:
            raise ValueError(f"environment {self.name!r} has no train tasks")
        if callable(source):
            tasks = list(source(size, seed * 100_003 + epoch))[:size]
        else:
            tasks = list(source)
            random.Random(seed * 100_003 + epoch).shuffle(tasks)
        if not tasks:
            raise ValueError(f"environment {self.name!r} generated no training tasks")
        return [self._prepare(t) for t in tasks]

    def _prepare(self, task: Task) -> Task:
        if not task.env:
            task.env = self.name
        if self.system_prompt and not (task.prompt and task.prompt[0].role == "system"):
            task.prompt = [Message(role="system", content=self.system_prompt), *task.prompt]
        return task

    def hint(self, task: Task, rng: random.Random) -> Hint | None:
        """Help for a training task (`looprl.envs.hints`), or None; the curriculum asks, only
        while the pass rate is low, never at evaluation. Override, or give `hint=` a function."""
        return None if self.hint_function is None else self.hint_function(task, rng)

    def for_task(self, task: Task) -> Environment:
        """The environment that runs `task` (itself; a mixture returns the task's sub-environment).

        The rollout calls it once per episode and uses the result for tools, parser, limits,
        hooks and rubric.
        """
        return self

    def close(self) -> None:
        """Release what the environment holds for the whole run (MCP servers); the trainer and
        `looprl eval` call it on every exit path. A no-op here; safe to call twice."""

    async def ensure_alive(self) -> None:
        """Restart what the environment holds for the run that died (a crashed MCP server); the
        rollout calls it before each batch of episodes. A no-op here."""

    async def setup_state(self, task: Task) -> dict[str, Any]:
        """Per-episode state; keys here fill hidden tool arguments. Override to add resources."""
        return {"task": task}

    async def cleanup_state(self, state: dict[str, Any]) -> None:
        """Release per-episode resources created in `setup_state`."""

    async def step(
        self, messages: list[Message], parsed: ParsedTurn, state: dict[str, Any]
    ) -> StepOutcome:
        """The environment's move after an assistant turn (`messages` ends with it)."""
        raise NotImplementedError


class SingleTurnEnv(Environment):
    """One prompt, one answer, scored by the rubric."""

    def __init__(self, **kwargs: Any) -> None:
        limits = kwargs.pop("limits", None) or Limits(max_turns=1)
        super().__init__(limits=limits, **kwargs)

    async def step(
        self, messages: list[Message], parsed: ParsedTurn, state: dict[str, Any]
    ) -> StepOutcome:
        """A single-turn episode ends after the first answer."""
        return StepOutcome(done=True)


class MultiTurnEnv(Environment):
    """A conversation driven by `env_response` (games, simulated users). Subclass and override it."""

    async def env_response(self, messages: list[Message], state: dict[str, Any]) -> list[Message]:
        """Messages answering the last assistant turn; an empty list ends the episode."""
        raise NotImplementedError("MultiTurnEnv subclasses must implement env_response")

    async def step(
        self, messages: list[Message], parsed: ParsedTurn, state: dict[str, Any]
    ) -> StepOutcome:
        """Ask `env_response`; an empty answer ends the episode."""
        reply = await self.env_response(messages, state)
        return StepOutcome(messages=list(reply), done=not reply)


class ToolEnv(Environment):
    """An environment that needs only tools and a rubric.

    After each assistant turn the parsed tool calls run concurrently and their results come
    back as tool messages; a turn without tool calls ends the episode, or, with a `user`
    (`looprl.envs.user`: a function `(messages, task) -> str | None` or a `ModelUser`), goes to
    the user, whose reply comes back as a user message until it answers None. Malformed calls
    are answered with a tool message explaining the problem and counted by kind.

    The tools come from sources (`looprl.tools.source`): `tools`, Python functions, and `mcp`,
    the tools of MCP servers (`looprl.mcp.MCPServer`s or tables of their fields), which start
    here and stop at `close()`, garbage collection or exit. `tool_timeout` bounds each call;
    when `max_hung_tool_calls` sync calls hang past it at once, the run stops (`ToolsHung`).
    `tool_isolation="process"` runs each sync call in a forked child, killed when it overruns
    (for tools that may hang and keep no state: `looprl.tools.forked`).
    """

    def __init__(
        self,
        *,
        tools: Iterable[Callable[..., Any]] = (),
        mcp: Iterable[MCPServer | Mapping[str, Any]] | None = None,
        tool_timeout: float = 10.0,
        max_tool_result_chars: int = 4000,
        max_hung_tool_calls: int = 256,
        tool_isolation: Isolation = "thread",
        user: SimulatedUser | UserFunction | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.user = as_user(user)
        self.sources: list[ToolSource] = [FunctionTools(tools)]
        if mcp:
            self.sources.append(MCPTools(mcp))
        try:
            self.tools = make_tools(tool for source in self.sources for tool in source.tools)
        except BaseException:
            self.close()
            raise
        self.executor = ToolExecutor(
            self.tools, timeout=tool_timeout, max_result_chars=max_tool_result_chars,
            max_hung=max_hung_tool_calls, isolation=tool_isolation,
        )  # fmt: skip

    async def setup_state(self, task: Task) -> dict[str, Any]:
        """The base state, plus what each tool source opens for the episode (MCP sessions)."""
        state = await super().setup_state(task)
        for source in self.sources:
            state.update(await source.open_episode())
        return state

    async def cleanup_state(self, state: dict[str, Any]) -> None:
        """Release what the tool sources opened for the episode."""
        for source in self.sources:
            await source.close_episode(state)

    async def ensure_alive(self) -> None:
        """Have each tool source restart what died since the last batch (an exited MCP server)."""
        for source in self.sources:
            await source.ensure_alive()

    def close(self) -> None:
        """Release what the tool sources hold for the run (stop MCP servers)."""
        for source in self.sources:
            source.close()

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        """OpenAI function schemas of this environment's tools."""
        return [t.schema for t in self.tools.values()]

    async def step(
        self, messages: list[Message], parsed: ParsedTurn, state: dict[str, Any]
    ) -> StepOutcome:
        """Run the turn's tool calls (and answer malformed ones); a turn without calls goes to
        the user, or ends the episode when there is none."""
        if not parsed.calls and not parsed.errors:
            return await self.user_turn(messages, state)
        return tool_step_outcome(parsed, await self.executor.run_turn(parsed, state))

    async def user_turn(self, messages: list[Message], state: dict[str, Any]) -> StepOutcome:
        """The user's answer to a turn without tool calls; no user, or None from it, ends it."""
        text = None if self.user is None else await self.user.reply(messages, state["task"])
        if text is None:
            return StepOutcome(done=True)
        return StepOutcome(messages=[Message(role="user", content=text)])
