"""A small environment written in the verifiers v1 API (0.4), for tests/test_verifiers_v1.py.

The shape `vf init` scaffolds: a TaskData, a Task with `@vf.reward` / `@vf.metric` / `@vf.stop`
and its own per-rollout Toolset (MCP), a Taskset whose `load` yields the tasks and which shares
one taskset-wide Toolset. The config's `kind` picks `length` (a reward a random model's replies spread over, for
training) or a variant the adapter must refuse.
"""

from __future__ import annotations

import verifiers.v1 as vf


class CalcToolset(vf.Toolset[vf.ToolsetConfig]):
    """Per-rollout calculator server; `setup_task` sees the task's data."""

    TOOL_PREFIX = "calc"

    async def setup_task(self, task) -> None:
        self.offset = 0 if task.answer else 1  # proves setup_task ran before any call

    @vf.tool
    def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b + self.offset


class NotesToolset(vf.Toolset[vf.ToolsetConfig]):
    """Taskset-wide server with bare tool names (TOOL_PREFIX None)."""

    TOOL_PREFIX = None

    @vf.tool
    def hint(self) -> str:
        """A hint for every task."""
        return "Use calc_add, then give the number."


class Counter(vf.State):
    """A typed toolset state (the adapter refuses it)."""

    calls: int = 0


class CountingToolset(vf.Toolset[vf.ToolsetConfig, Counter]):
    TOOL_PREFIX = "count"

    @vf.tool
    def bump(self) -> int:
        """Count a call."""
        self.state.calls += 1
        return self.state.calls


class SumData(vf.TaskData):
    answer: str = ""


class SumTask(vf.Task[SumData]):
    @vf.reward(weight=1.0)
    async def exact_answer(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == f"The answer is {self.data.answer}.")

    @vf.reward(weight=0.5)
    async def used_tool(self, trace: vf.Trace) -> float:
        return float(bool(trace.tool_messages))

    @vf.metric
    async def turns(self, trace: vf.Trace) -> float:
        return float(trace.num_turns)

    @vf.stop
    async def gave_up(self, trace: vf.Trace) -> bool:
        return "I give up" in trace.last_reply

    @classmethod
    def toolsets(cls, config: vf.TaskConfig) -> list[vf.Toolset]:
        return [CalcToolset(vf.ToolsetConfig())]


class StatefulTask(SumTask):
    @classmethod
    def toolsets(cls, config: vf.TaskConfig) -> list[vf.Toolset]:
        return [CountingToolset(vf.ToolsetConfig())]


class RuntimeTask(SumTask):
    @vf.reward
    async def file_exists(self, trace: vf.Trace, runtime: vf.Runtime) -> float:
        return 1.0


class LengthTask(SumTask):
    """Adds a reward a random model's replies spread over (characters of the last reply)."""

    @vf.reward(weight=1.0)
    async def reply_length(self, trace: vf.Trace) -> float:
        return min(len(trace.last_reply), 4000) / 4000


class SumConfig(vf.TasksetConfig):
    num_tasks: int = 4
    kind: str = "sum"


KINDS = {"sum": SumTask, "length": LengthTask, "stateful": StatefulTask, "runtime": RuntimeTask}
"""The task class of each `kind`."""


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    def load(self) -> list[SumTask]:
        task_cls = KINDS[self.config.kind]
        return [
            task_cls(
                SumData(
                    prompt=f"What is {i} + {i + 1}?",
                    system_prompt="Add with the tools, then say 'The answer is N.'",
                    answer=str(2 * i + 1),
                ),
                self.config.task,
            )
            for i in range(self.config.num_tasks)
        ]

    @classmethod
    def toolsets(cls, config: SumConfig) -> list[vf.Toolset]:
        return [NotesToolset(vf.ToolsetConfig())]


__all__ = ["SumTaskset"]
