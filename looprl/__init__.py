"""looprl: train agentic reasoners with token-exact multi-turn RL.

`import looprl` is the environment author's namespace: an environment (tasks, tools, a rubric)
imports from here alone, as every bundled one in `looprl/envs/` does::

    from looprl import EpisodeResult, Limits, Message, Rubric, Task, ToolEnv, final_answer_text, split_of

- environments: `Environment` and its three shapes `SingleTurnEnv`, `MultiTurnEnv` (a game or a
  simulated user: `env_response`), `ToolEnv`; `Limits`, `StepOutcome`, `TaskSource`, the
  `ParsedTurn` a `step` hook receives; `load_environment`, `available_environments`; the other
  party of a `ToolEnv(user=...)`: `ScriptedUser`, `ModelUser`, `SimulatedUser`; the help an
  environment may give a training task (`Hint`, `HintFunction`, `note_hint`,
  `tool_call_hint`, `answer_note`, `then_note`);
- tools: typed Python functions whose schema comes from the signature and docstring (`make_tool`,
  `tool_schema`), `Hidden` arguments filled from the episode's state, `ToolError` and
  `ToolReply` to fail a call or add a status; the sandboxed `python` tools (`make_python_tools`)
  and the message one of their calls shows (`format_result` of an `ExecResult`);
- rewards: `Rubric`, the kit (`final_answer_text`, `model_messages`, `tool_calls`, `used_tool`,
  `split_of`, ...), `JudgeRubric`;
- data: `load_tasks`, `train_eval_tasks` (an environment's `dataset=` argument), `iter_jsonl`
  (your own JSONL files, each bad line an error naming it);
- records: `Task`, `Message`, `ToolCall`, `ToolOutcome`, `EpisodeResult`.

Engines, rollout, training and the command line are imported from their own packages. These are
plain imports of layers 1, 3 and 5 (docs/design.md): they pull pydantic and httpx but never torch
or transformers (tests/test_author_namespace.py holds that), so `import looprl` stays cheap.
"""

from looprl.datasets import DatasetError, load_tasks, train_eval_tasks
from looprl.envs.base import (
    Environment,
    Limits,
    MultiTurnEnv,
    SingleTurnEnv,
    StepOutcome,
    TaskSource,
    ToolEnv,
)
from looprl.envs.hints import (
    Hint,
    HintFunction,
    answer_note,
    note_hint,
    then_note,
    tool_call_hint,
)
from looprl.envs.registry import available_environments, load_environment
from looprl.envs.user import ModelUser, ScriptedUser, SimulatedUser
from looprl.files import iter_jsonl
from looprl.judge.rubric import JudgeRubric, judge_injection
from looprl.kit import (
    answer_text,
    final_answer_text,
    final_raw,
    final_reasoning,
    final_reply,
    model_messages,
    shown_outcomes,
    split_of,
    tool_call_validity,
    tool_calls,
    used_tool,
)
from looprl.rendering.parser import ParsedTurn
from looprl.rubrics import Rubric
from looprl.sandbox import (
    SESSION_KEY,
    ExecResult,
    format_result,
    make_executor,
    make_python_tools,
    new_session_id,
)
from looprl.tools import ERROR_KINDS, Hidden, Tool, ToolError, ToolReply, make_tool, tool_schema
from looprl.types import EpisodeResult, Message, Task, ToolCall, ToolOutcome

__all__ = [
    "ERROR_KINDS",
    "SESSION_KEY",
    "DatasetError",
    "Environment",
    "EpisodeResult",
    "Hidden",
    "Hint",
    "HintFunction",
    "JudgeRubric",
    "Limits",
    "Message",
    "ModelUser",
    "MultiTurnEnv",
    "ParsedTurn",
    "Rubric",
    "ScriptedUser",
    "SimulatedUser",
    "SingleTurnEnv",
    "StepOutcome",
    "Task",
    "TaskSource",
    "Tool",
    "ToolCall",
    "ToolEnv",
    "ToolError",
    "ToolOutcome",
    "ToolReply",
    "answer_text",
    "available_environments",
    "final_answer_text",
    "final_raw",
    "final_reasoning",
    "final_reply",
    "iter_jsonl",
    "judge_injection",
    "load_environment",
    "load_tasks",
    "make_executor",
    "make_python_tools",
    "ExecResult",
    "format_result",
    "make_tool",
    "model_messages",
    "new_session_id",
    "note_hint",
    "answer_note",
    "then_note",
    "shown_outcomes",
    "split_of",
    "tool_call_hint",
    "tool_call_validity",
    "tool_calls",
    "tool_schema",
    "train_eval_tasks",
    "used_tool",
]
