"""verifiers v1 environments (0.4's `Taskset` / `Task` / `Toolset`) as looprl tool environments.

`verifiers-v1:TASKSET` names an installed taskset package (the id `vf-eval` takes) or a `.py`
file exporting one `Taskset` subclass; keyword arguments fill its `TasksetConfig` (`limit`
takes the first N tasks). verifiers 0.4 pins openai<3 and mcp==2.0.0 and replaces the 0.1
package of the same name, so it runs in a venv of its own (`make verifiers-v1`, or the python
in `$LOOPRL_VERIFIERS_V1_PYTHON`) behind a process boundary: `_verifiers_v1_worker.py` loads
the taskset there and answers this adapter over a pipe. looprl samples every token (its
renderer, masks and logprobs); the taskset supplies the rest:

- tasks: each task of `load()`, its `system_prompt` then its `prompt` as the opening messages;
  train and eval both read the taskset (a v1 taskset has one stream, as `vf-eval` reads it);
- tools: every `@vf.tool` of the taskset's `toolsets` (one shared instance, set up once) and of
  the task's `toolsets` (set up per episode, `setup_task` with the task's data), each called
  through the MCP SDK's `MCPServer` it registers with (in the worker process, no transport) and
  named `<TOOL_PREFIX>_<tool>` as verifiers' harnesses name them; looprl's executor checks
  arguments against their MCP input schemas, times and caps the calls;
- turns: a turn without tool calls ends the episode, as in verifiers' tool loop; after each
  turn the task's `@vf.stop` methods on the `Trace` run and may end it;
- rubric: each `@vf.reward` with its weight, each `@vf.metric` at weight 0, computed once per
  episode by `Task.score` over a `Trace` of the conversation.

What does not map is refused at load with one line (`_verifiers_v1_worker.REFUSED`).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

from looprl.envs.base import Environment, Limits, StepOutcome, tool_step_outcome
from looprl.mcp.tools import check_refs, mcp_params, mcp_tool_schema
from looprl.models.cache import cache_root
from looprl.rendering.parser import ParsedTurn
from looprl.rubrics import Rubric
from looprl.tools.executor import ToolError, ToolExecutor
from looprl.tools.schema import Tool
from looprl.types import EpisodeResult, Message, Task

WORKER = Path(__file__).with_name("_verifiers_v1_worker.py")
EPISODE_KEY = "vf1_episode"
"""Episode-state key of the worker's episode id (its task toolsets)."""
_HIDDEN = "looprl_vf1_episode"
_SCORES = "vf1_scores"


def verifiers_v1_python() -> Path:
    """The python of the verifiers v1 venv: `$LOOPRL_VERIFIERS_V1_PYTHON`, else
    `$LOOPRL_CACHE/venvs/verifiers-v1` (made by `make verifiers-v1`)."""
    override = os.environ.get("LOOPRL_VERIFIERS_V1_PYTHON")
    python = (
        Path(override) if override else cache_root() / "venvs" / "verifiers-v1" / "bin" / "python"
    )
    if not python.exists():
        raise ValueError(
            f"no verifiers v1 python at {python}; run `make verifiers-v1` (a venv with "
            "verifiers==0.4.0) or set LOOPRL_VERIFIERS_V1_PYTHON to a python that has it"
        )
    return python


class Worker:
    """The worker process: one request at a time over its pipes (a thread lock orders them)."""

    def __init__(self, python: Path) -> None:
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in close()
        self._proc = subprocess.Popen(  # -P: the script's folder would shadow `verifiers`
            [str(python), "-P", str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._stderr, text=True,
        )  # fmt: skip
        self._lock = threading.Lock()

    def request(self, op: str, **args: Any) -> Any:
        """Send one request and return its answer; ValueError carries the worker's one line."""
        with self._lock:
            assert self._proc.stdin is not None and self._proc.stdout is not None
            try:
                self._proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
                self._proc.stdin.flush()
                line = self._proc.stdout.readline()
            except BrokenPipeError:
                line = ""
            if not line:
                self._stderr.seek(0)
                tail = self._stderr.read()[-1500:]
                raise RuntimeError(f"the verifiers v1 worker exited during {op!r}:\n{tail}")
        reply = json.loads(line)
        if "error" in reply:
            raise ValueError(reply["error"])
        return reply["ok"]

    async def arequest(self, op: str, **args: Any) -> Any:
        """`request` off the event loop."""
        return await asyncio.to_thread(self.request, op, **args)

    def close(self) -> None:
        """End the worker (closing its stdin ends its loop); safe to call twice."""
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._stderr.close()


def load_verifiers_v1_environment(
    target: str, *, limit: int | None = None, max_turns: int = 6, **config: Any
) -> VerifiersV1Env:
    """Start the worker, load the taskset `target` with `config` and wrap it."""
    worker = Worker(verifiers_v1_python())
    try:
        path = Path(target)
        spec = str(path.resolve()) if path.suffix == ".py" else target
        described = worker.request("load", target=spec, config=config, limit=limit)
        return VerifiersV1Env(worker, described, name=f"verifiers-v1:{target}", max_turns=max_turns)
    except BaseException:
        worker.close()
        raise


class VerifiersV1Env(Environment):
    """A looprl environment over a verifiers v1 taskset loaded in the worker (module docstring)."""

    def __init__(
        self, worker: Worker, described: dict[str, Any], *, name: str, max_turns: int
    ) -> None:
        self.worker = worker
        tasks = [_task(t) for t in described["tasks"]]
        names = [n for n, _ in described["rewards"]] + list(described["metrics"])
        rewards = [_reward(n, worker) for n in names]
        weights = [float(w) for _, w in described["rewards"]] + [0.0] * len(described["metrics"])
        super().__init__(
            name=name,
            rubric=Rubric(rewards, weights=weights),
            train_tasks=tasks,
            eval_tasks=tasks,
            limits=Limits(max_turns=max_turns),
        )
        self.tools = {t["name"]: self._tool(t) for t in described["tools"]}
        self.executor = ToolExecutor(self.tools)

    def _tool(self, spec: dict[str, Any]) -> Tool:
        """One worker tool as a looprl `Tool`, its call routed to the episode's toolsets."""
        name, schema = spec["name"], spec["input_schema"]
        where = f"verifiers v1 tool {name!r}"
        check_refs(schema, where)
        params, shown = mcp_params(schema, where)
        worker = self.worker

        async def call_vf1_tool(**arguments: Any) -> str:
            episode = arguments.pop(_HIDDEN)
            out = await worker.arequest("call", episode=episode, name=name, arguments=arguments)
            if out["is_error"]:
                raise ToolError(out["text"])
            return str(out["text"])

        return Tool(
            name=name, fn=call_vf1_tool, schema=mcp_tool_schema(name, spec["description"], schema),
            hidden={_HIDDEN: EPISODE_KEY}, is_async=True, params=params,
            signature=f"{name}({shown})",
        )  # fmt: skip

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        """The OpenAI schemas of the taskset's and the task's toolsets."""
        return self.executor.schemas

    async def setup_state(self, task: Task) -> dict[str, Any]:
        """Set up the task's own toolsets in the worker for this episode."""
        state = await super().setup_state(task)
        state[EPISODE_KEY] = await self.worker.arequest("open", task=task.info["vf_key"])
        return state

    async def cleanup_state(self, state: dict[str, Any]) -> None:
        """Tear the episode's toolsets down."""
        if EPISODE_KEY in state:
            await self.worker.arequest("close", episode=state[EPISODE_KEY])

    async def step(
        self, messages: list[Message], parsed: ParsedTurn, state: dict[str, Any]
    ) -> StepOutcome:
        """Run the turn's tool calls; no calls, or a `@vf.stop` on the trace, ends the episode."""
        if not parsed.calls and not parsed.errors:
            return StepOutcome(done=True)
        key = state["task"].info["vf_key"]
        if await self.worker.arequest("stop", task=key, messages=to_vf(messages)):
            return StepOutcome(done=True)
        return tool_step_outcome(parsed, await self.executor.run_turn(parsed, state))

    def close(self) -> None:
        """Stop the worker."""
        self.worker.close()


def _task(spec: dict[str, Any]) -> Task:
    """A looprl task of one taskset task (its key kept in `info` to find it in the worker)."""
    prompt = [Message.from_dict(m) for m in spec["messages"]]
    for m in prompt:
        if not isinstance(m.content, str):
            raise ValueError(f"task {spec['idx']} has content parts; looprl maps text content only")
    return Task(id=f"{spec['idx']}-{spec['key'][:12]}", prompt=prompt, info={"vf_key": spec["key"]})


def _reward(name: str, worker: Worker) -> Any:
    """A looprl reward reading `name` from the episode's v1 scores (one `score` per episode)."""

    async def reward(episode: EpisodeResult) -> float:
        scores = episode.state.get(_SCORES)
        if scores is None:
            key, messages = episode.task.info["vf_key"], to_vf(episode.messages)
            scores = await worker.arequest("score", task=key, messages=messages)
            episode.state[_SCORES] = scores
        if name in scores["metrics"]:
            return float(scores["metrics"][name])
        value = scores["rewards"].get(name)
        if value is None:
            raise ValueError(f"the verifiers reward {name!r} recorded no score")
        return float(value[0])

    reward.__name__ = name
    return reward


def to_vf(messages: list[Message]) -> list[dict[str, Any]]:
    """looprl messages as verifiers v1 ones (tool calls flat, arguments a JSON string)."""
    out = []
    for m in messages:
        item: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            item["tool_calls"] = [
                {"id": c.id, "name": c.name, "arguments": json.dumps(c.arguments)}
                for c in m.tool_calls
            ]
        if m.tool_call_id is not None:
            item["tool_call_id"] = m.tool_call_id
        out.append(item)
    return out
