"""The verifiers v1 side of `verifiers-v1:` environments: a script run by the verifiers venv's python.

verifiers 0.4 pins openai<3 and mcp==2.0.0 (looprl has newer ones) and replaces the 0.1 package
of the same name, so it lives in a venv of its own and this script, importing only the standard
library and `verifiers.v1`, serves looprl's adapter (`looprl/envs/foreign/verifiers_v1.py`) over
stdin/stdout: one JSON request per line, one JSON reply per line (`{"ok": ...}` or
`{"error": "one line"}`). Requests, in the order a run makes them:

- `load {target, config, limit}`: import the taskset (an installed id or a `.py` file), build its
  config, list its tasks (prompt messages), its toolsets' tools, its rewards and metrics; refuse
  what does not map (`REFUSED`);
- `open {task}` -> episode id: build and set up the task's own toolsets (`Task.toolsets`) for one
  episode; `call {episode, name, arguments}` runs one tool through MCP (an in-process `MCPServer`
  per toolset, no transport; the schema and argument checks of verifiers' own servers); `close {episode}`;
- `stop {task, messages}`: whether a `@vf.stop` on the `Trace` ends the episode;
- `score {task, messages}`: the task's `@vf.reward`s and `@vf.metric`s over a `Trace` of the
  messages (`Task.score`, no runtime).
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import verifiers.v1 as vf
from mcp.server.mcpserver import MCPServer
from pydantic import TypeAdapter
from verifiers.v1.graph import MessageNode
from verifiers.v1.session import hook_boundary
from verifiers.v1.trace import AgentInfo, TraceTask
from verifiers.v1.utils import loaders
from verifiers.v1.utils.decorators import invoke
from verifiers.v1.utils.generic import concrete_type

REFUSED = {
    "container": "a Task with NEEDS_CONTAINER: looprl runs no verifiers Runtime (container)",
    "hooks": "Task.setup/finalize/stage_verifier: they act on a verifiers Runtime",
    "runtime": "a reward or metric that needs `runtime`: looprl scores without a Runtime",
    "judges": "task.config.judges: a judge calls a model client of its own",
    "boundary_stop": "a @vf.stop on Request/Response: only Trace stops are checked, per turn",
    "state": "a Toolset with a State subclass: that state rides verifiers' HTTP channel",
    "remote": "a Toolset with config.url: remote tool servers are not reached",
    "no_prompt": "a task without a prompt: the user-opens (Interaction) channel is not mapped",
    "infinite": "an INFINITE taskset without a limit: pass limit=N (--env.limit N)",
    "harness": "a taskset's own Harness or Env: looprl's rollout is the harness",
}
"""What the adapter refuses, by key, with the reason; the error names the task class."""

MESSAGES = TypeAdapter(list[vf.Message])


class Refused(ValueError):
    """A part of the environment the adapter cannot map (one line, from `REFUSED`)."""


def import_taskset(target: str) -> type[vf.Taskset]:
    """The Taskset class of an installed taskset id or of a `.py` file (its one `__all__`
    export, as verifiers' own loader reads it); the file's folder goes on sys.path for its own
    imports. A module that also exports a Harness or an Env is refused."""
    module = import_file(target) if target.endswith(".py") else loaders.import_taskset(target)
    names = getattr(module, "__all__", None) or list(vars(module))
    exported = [getattr(module, n, None) for n in names]
    classes = [c for c in exported if inspect.isclass(c)]
    own = [c for c in classes if issubclass(c, (vf.Harness, vf.Env))]
    if own:
        raise Refused(f"{target} exports {own[0].__name__}, {REFUSED['harness']}")
    found = [c for c in classes if issubclass(c, vf.Taskset) and c is not vf.Taskset]
    if len(found) != 1:
        names = [c.__name__ for c in found]
        raise ValueError(f"{target} must export exactly one Taskset subclass, found {names}")
    return found[0]


def import_file(target: str) -> Any:
    """Import a `.py` file as a module named after it, its folder first on sys.path."""
    path = Path(target).resolve()
    if not path.is_file():
        raise ValueError(f"taskset file {target!r} does not exist")
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def check_task(task: vf.Task) -> None:
    """Raise Refused naming the first part of the task's class that does not map."""
    cls = type(task)
    problems = []
    if cls.NEEDS_CONTAINER:
        problems.append("container")
    if any(
        getattr(cls, h) is not getattr(vf.Task, h) for h in ("setup", "finalize", "stage_verifier")
    ):
        problems.append("hooks")
    scoring = task.hooks("reward") + task.hooks("metric")
    if any("runtime" in inspect.signature(fn).parameters for fn in scoring):
        problems.append("runtime")
    if task.config.judges:
        problems.append("judges")
    if any(hook_boundary(fn, allow_trace=True) is not vf.Trace for fn in task.hooks("stop")):
        problems.append("boundary_stop")
    if task.data.prompt is None:
        problems.append("no_prompt")
    if problems:
        raise Refused(f"{cls.__name__} uses {REFUSED[problems[0]]}")


def check_toolset(toolset: Any) -> None:
    """Raise Refused when a toolset's state or placement does not map."""
    if toolset._state_cls is not vf.State:
        raise Refused(f"{type(toolset).__name__} is {REFUSED['state']}")
    if getattr(toolset.config, "url", None):
        raise Refused(f"{type(toolset).__name__} is {REFUSED['remote']}")


def prompt_messages(data: vf.TaskData) -> list[dict[str, Any]]:
    """The task's opening messages: its system prompt, then its prompt (a string is one user turn)."""
    prompt = data.prompt
    messages = (
        [] if data.system_prompt is None else [{"role": "system", "content": data.system_prompt}]
    )
    if isinstance(prompt, str):
        return [*messages, {"role": "user", "content": prompt}]
    return messages + [m.model_dump(mode="json", exclude_none=True) for m in prompt or []]


class Servers:
    """Toolsets served in process, each through verifiers' own `register` on an `MCPServer`."""

    def __init__(self) -> None:
        self.toolsets: list[Any] = []
        self.routes: dict[str, tuple[MCPServer, str]] = {}
        self.tools: list[dict[str, Any]] = []

    async def add(self, toolsets: list[Any]) -> None:
        """Set up each toolset and list its tools (named `<server>_<tool>`, as verifiers does)."""
        for toolset in toolsets:
            check_toolset(toolset)
            await toolset._exit_stack.__aenter__()  # what verifiers' own serve enters
            self.toolsets.append(toolset)
            await toolset.setup()
            server = MCPServer(toolset.server_name or type(toolset).__name__)
            toolset.register(server)
            for tool in await server.list_tools():
                name = f"{toolset.server_name}_{tool.name}" if toolset.server_name else tool.name
                self.routes[name] = (server, tool.name)
                self.tools.append(
                    {
                        "name": name,
                        "description": tool.description or "",
                        "input_schema": tool.input_schema,
                    }
                )

    async def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Run one tool: its text, and whether it failed (a bad argument is the model's error)."""
        server, raw = self.routes[name]
        try:
            result = await server.call_tool(raw, arguments)
        except Exception as exc:  # verifiers' ToolError: bad arguments or a raising tool
            return {"text": str(exc), "is_error": True}
        content = getattr(result, "content", None)
        if content is None:  # an MCP input request (elicitation): nobody is there to answer
            return {"text": f"{name} asked for input, which is not mapped", "is_error": True}
        text = "\n".join(getattr(b, "text", str(b)) for b in content)
        return {"text": text, "is_error": bool(getattr(result, "is_error", False))}

    async def close(self) -> None:
        """Leave each toolset's exit stack (what its `setup` entered)."""
        for toolset in self.toolsets:
            await toolset._exit_stack.aclose()


class Worker:
    """One loaded taskset: its tasks by key, its shared toolsets and the open episodes."""

    def __init__(self) -> None:
        self.tasks: dict[str, vf.Task] = {}
        self.shared = Servers()
        self.episodes: dict[str, Servers] = {}
        self.counter = itertools.count()

    async def load(self, target: str, config: dict[str, Any], limit: int | None) -> dict[str, Any]:
        """Build the taskset and describe it (see the module docstring)."""
        cls = import_taskset(target)
        config_cls = concrete_type(cls, vf.TasksetConfig) or vf.TasksetConfig
        taskset = cls(config_cls.model_validate({**config, "id": target}))
        if limit is not None:
            taskset = taskset.take(limit)
        elif not taskset.bounded:
            raise Refused(f"{cls.__name__} is {REFUSED['infinite']}")
        tasks = list(taskset)
        if not tasks:
            raise ValueError(f"the taskset {cls.__name__} loaded no tasks")
        for task in tasks:
            check_task(task)
            self.tasks[task.key] = task
        await self.shared.add(cls.toolsets(taskset.config))
        probe = Servers()  # the task toolsets' tools, listed once (every task has the same class)
        await probe.add(type(tasks[0]).toolsets(tasks[0].config))
        await probe.close()
        first = tasks[0]
        return {
            "name": cls.__name__,
            "tasks": [
                {"key": t.key, "idx": t.data.idx, "messages": prompt_messages(t.data)}
                for t in tasks
            ],
            "tools": self.shared.tools + probe.tools,
            "rewards": [
                [fn.__name__, getattr(fn, "_vf_weight", 1.0)] for fn in first.hooks("reward")
            ],
            "metrics": [fn.__name__ for fn in first.hooks("metric")],
        }

    async def open(self, task: str) -> str:
        """Set up the task's own toolsets for one episode; its id."""
        servers = Servers()
        item = self.tasks[task]
        await servers.add(type(item).toolsets(item.config))
        for toolset in servers.toolsets:
            await toolset.setup_task(item.data)
        episode = str(next(self.counter))
        self.episodes[episode] = servers
        return episode

    async def call(self, episode: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Run a tool of the episode's toolsets or of the shared ones."""
        servers = self.episodes[episode]
        return await (servers if name in servers.routes else self.shared).call(name, arguments)

    async def close(self, episode: str) -> None:
        """Tear the episode's toolsets down."""
        servers = self.episodes.pop(episode, None)
        if servers is not None:
            await servers.close()

    def trace(self, task: str, messages: list[dict[str, Any]]) -> vf.Trace:
        """A verifiers Trace of a finished (or ongoing) conversation, one node per message."""
        item = self.tasks[task]
        nodes = [
            MessageNode(parent=i - 1 if i else None, message=m, sampled=m.role == "assistant")
            for i, m in enumerate(MESSAGES.validate_python(messages))
        ]
        return vf.Trace(
            task=TraceTask(type=type(item).__name__, data=item.data, key=item.key),
            agent=AgentInfo(config=vf.AgentConfig()),
            nodes=nodes,
        )

    async def stop(self, task: str, messages: list[dict[str, Any]]) -> str | None:
        """The name of the first `@vf.stop` (on the Trace) that fires, else None."""
        item, trace = self.tasks[task], self.trace(task, messages)
        for fn in item.hooks("stop"):
            value = invoke(fn, {"task": item.data, "trace": trace, vf.Trace: trace})
            if await value if inspect.isawaitable(value) else value:
                return fn.__name__
        return None

    async def score(self, task: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """The task's rewards (score and weight) and metrics over the conversation."""
        trace = self.trace(task, messages)
        await self.tasks[task].score(trace)
        rewards = {k: None if r is None else [r.score, r.weight] for k, r in trace.rewards.items()}
        return {"rewards": rewards, "metrics": dict(trace.metrics)}


def one_line(exc: BaseException) -> str:
    """An error as one line, with the error it was raised from (verifiers' loader hides the
    import error of a taskset that is installed but does not import)."""
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    cause = exc.__cause__
    return text if cause is None else f"{text} (from {one_line(cause)})"


OPS = ("load", "open", "call", "close", "stop", "score")
"""The requests a worker answers (methods of `Worker`)."""


async def serve(reader: Any, out: Any) -> None:
    """Answer requests until stdin closes."""
    worker = Worker()
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, reader.readline):
        request = json.loads(line)
        op = request.pop("op")
        try:
            if op not in OPS:
                raise ValueError(f"unknown request {op!r}; one of {OPS}")
            reply = {"ok": await getattr(worker, op)(**request)}
        except Exception as exc:  # every failure goes back as one line; the adapter raises it
            reply = {"error": one_line(exc)}
        out.write(json.dumps(reply, default=str) + "\n")
        out.flush()


if __name__ == "__main__":
    stdout, sys.stdout = sys.stdout, sys.stderr  # prints of the environment stay off the channel
    asyncio.run(serve(sys.stdin, stdout))
