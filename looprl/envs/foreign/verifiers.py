"""verifiers environments (the 0.1 line's SingleTurnEnv / ToolEnv / MultiTurnEnv) as looprl ones.

`VerifiersEnv` wraps a verifiers environment so that looprl's rollout samples every token (exact
masks and logprobs) while the verifiers code keeps its meaning:

- tasks: each row of `get_dataset()` / `get_eval_dataset()` (already formatted by verifiers:
  `prompt` with its system prompt and few-shot turns, `answer`, `info`, `task`, `example_id`);
  a `prompt` that is a string (a text column in a chat environment) is one user turn;
- tools of a plain `vf.ToolEnv`: its python functions become looprl tools (schemas from their
  signatures and docstrings) run by looprl's executor (timeouts, size caps, error kinds);
- after each assistant turn the turn is added to the verifiers state's `trajectory` (through the
  env's `add_trajectory_step`), then `is_completed(state)` runs every `@vf.stop` condition; if
  none fires, a `MultiTurnEnv`'s `env_response(messages, state)` answers (a `final_env_response`
  it sets ends the episode and is shown to the rubric, never to the model);
- the rubric: every reward function and metric of the (nested) `Rubric` / `RubricGroup`, with its
  weight, is called with the arguments verifiers gives it (`prompt`, `completion`, `answer`,
  `state`, `task`, `info`, the rubric's class objects such as `parser`; plural names for group
  functions). Departure: a function that raises is a looprl scoring error, not verifiers' 0.0.

What does not map raises `ValueError` at load naming it (`UNMAPPED` lists them).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any

from looprl.envs.base import Environment, Limits, StepOutcome, tool_step_outcome
from looprl.envs.foreign.common import (
    import_environment_module,
    keep_signal_handlers,
    require,
)
from looprl.rendering.parser import ParsedTurn
from looprl.rubrics import Rubric
from looprl.tools.executor import ToolExecutor
from looprl.tools.schema import make_tools
from looprl.types import EpisodeResult, Message, Task

UNMAPPED = {
    "message_type='completion'": "looprl rollouts are chat conversations",
    "EnvGroup": "use looprl's mixture environment over several verifiers:MODULE environments",
    "StatefulToolEnv": "hidden tool arguments (update_tool_args) are not mapped; write a looprl "
    "ToolEnv with Hidden[...] arguments",
    "get_prompt_messages / render_completion overrides": "looprl keeps one linear conversation",
    "sampling_args other than max_tokens": "set sampling with looprl's rollout.* config",
    "a Rubric subclass overriding score_rollout / score_group": "looprl calls each reward "
    "function itself",
    "an Environment that is not a MultiTurnEnv": "its own rollout() would bypass looprl's",
}
"""Parts of the verifiers API the adapter refuses, with the reason or the way out."""

_PASSIVE_SAMPLING = {"n": 1, "extra_body": {}}
_MAX_TOKEN_KEYS = ("max_tokens", "max_completion_tokens")
_INDIVIDUAL = ("prompt", "completion", "answer", "state", "task", "info")
_GROUP = ("prompts", "completions", "answers", "states", "tasks", "infos")


def load_verifiers_environment(target: str, **kwargs: Any) -> VerifiersEnv:
    """Import `target` (module, package or .py file), call its `load_environment(**kwargs)` and
    wrap the verifiers environment it returns."""
    vf = require("verifiers", "verifiers", f"verifiers:{target}")
    module = import_environment_module(target)
    factory = getattr(module, "load_environment", None)
    if not callable(factory):
        raise ValueError(f"verifiers:{target} has no load_environment(**kwargs) function")
    with keep_signal_handlers():  # vf.Environment installs SIGINT/SIGTERM handlers of its own
        try:
            vf_env = factory(**kwargs)
        except TypeError as exc:
            raise ValueError(
                f"load_environment of verifiers:{target} rejected the arguments "
                f"{sorted(kwargs)}: {exc}"
            ) from exc
    if not isinstance(vf_env, vf.Environment):
        raise TypeError(
            f"load_environment of verifiers:{target} returned {type(vf_env).__name__}, "
            "expected a verifiers Environment"
        )
    return VerifiersEnv(vf_env, name=f"verifiers:{target}")


class VerifiersEnv(Environment):
    """A looprl environment driving a verifiers `MultiTurnEnv` (and its subclasses)."""

    def __init__(
        self,
        vf_env: Any,
        *,
        name: str,
        tool_timeout: float = 10.0,
        max_tool_result_chars: int = 4000,
    ) -> None:
        vf = require("verifiers", "verifiers", name)
        check_mapped(vf_env, vf)
        self.vf_env = vf_env
        self._rows: dict[str, dict[str, Any]] = {}
        train = self._tasks(vf_env.get_dataset(), "train") if vf_env.dataset_source else None
        evals = (
            self._tasks(vf_env.get_eval_dataset(), "eval") if vf_env.eval_dataset_source else None
        )
        super().__init__(
            name=name,
            rubric=rubric_from(vf_env.rubric, self, vf),
            train_tasks=train,
            eval_tasks=evals if evals is not None else train,  # verifiers falls back to train too
            limits=limits_from(vf_env),
        )
        self.executor: ToolExecutor | None = None
        self._schemas: list[dict[str, Any]] = list(vf_env.oai_tools or [])
        if is_plain_tool_env(vf_env, vf):
            tools = make_tools(list(vf_env.tools))
            self.executor = ToolExecutor(
                tools, timeout=tool_timeout, max_result_chars=max_tool_result_chars
            )
            self._schemas = self.executor.schemas

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools' OpenAI schemas (looprl's from the functions, or the env's `oai_tools`)."""
        return self._schemas

    def _tasks(self, dataset: Any, split: str) -> list[Task]:
        """One looprl task per formatted verifiers row; the row is kept to start its state."""
        tasks = []
        for row in dataset:
            info = row.get("info") or {}
            info = json.loads(info) if isinstance(info, str) else dict(info)
            task_id = f"{split}-{row['example_id']}"
            answer = row.get("answer")
            messages = row["prompt"]
            if isinstance(messages, str):  # a text `prompt` column of a chat env: one user turn
                messages = [{"role": "user", "content": messages}]
            self._rows[task_id] = {
                "prompt": messages, "answer": answer if answer is not None else "",
                "task": row.get("task", "default"), "info": info, "example_id": row["example_id"],
            }  # fmt: skip
            prompt = [
                _from_vf(m, f"{self.name_hint(split)} row {row['example_id']}") for m in messages
            ]
            text = answer if isinstance(answer, str) or answer is None else json.dumps(answer)
            tasks.append(Task(id=task_id, prompt=prompt, answer=text, info=info))
        return tasks

    @staticmethod
    def name_hint(split: str) -> str:
        """How a dataset split is named in error messages."""
        return "dataset" if split == "train" else "eval_dataset"

    async def setup_state(self, task: Task) -> dict[str, Any]:
        """The looprl state holds the verifiers `State` (`init_state` + the env's `setup_state`)."""
        state = await super().setup_state(task)
        row = self._rows.get(task.id)
        if row is None:
            raise ValueError(f"task {task.id!r} is not a row of {self.name}'s datasets")
        vf_state = await self.vf_env.init_state(row, client=None, model="looprl")
        state["vf_state"] = await self.vf_env.setup_state(vf_state)
        return state

    async def cleanup_state(self, state: dict[str, Any]) -> None:
        """Run the env's `@vf.cleanup` handlers when a looprl limit, not a stop condition, ended it."""
        vf_state = state.get("vf_state")
        if vf_state is not None and not vf_state.get("is_completed"):
            await self.vf_env._cleanup(vf_state)

    async def step(
        self, messages: list[Message], parsed: ParsedTurn, state: dict[str, Any]
    ) -> StepOutcome:
        """Record the turn in the verifiers state, check its stop conditions, then answer."""
        vf_state = state["vf_state"]
        vf_messages = [_to_vf(m) for m in messages]
        step = {
            "prompt": vf_messages[:-1], "completion": vf_messages[-1:], "response": None,
            "tokens": None, "reward": None, "advantage": None, "is_truncated": False,
            "trajectory_id": vf_state["trajectory_id"], "extras": {},
        }  # fmt: skip
        await self.vf_env.add_trajectory_step(vf_state, step)
        if await self.vf_env.is_completed(vf_state):
            return StepOutcome(done=True)
        if self.executor is not None:
            return tool_step_outcome(parsed, await self.executor.run_turn(parsed, state))
        reply = await self.vf_env.env_response(vf_messages, vf_state)
        if isinstance(reply, str):
            raise TypeError(
                f"{self.name}: env_response returned a string; chat envs return messages"
            )
        where = f"{self.name} env_response"
        if vf_state.get("final_env_response") is not None:
            return StepOutcome(done=True)  # shown to the rubric (completion), not to the model
        return StepOutcome(messages=[_from_vf(m, where) for m in reply], done=not reply)

    def completion(self, episode: EpisodeResult) -> list[dict[str, Any]]:
        """The verifiers `completion` of an episode: its messages after the prompt, plus a
        `final_env_response` if the environment gave one."""
        out = [_to_vf(m) for m in episode.messages[len(episode.task.prompt) :]]
        final = _vf_state(episode).get("final_env_response")
        return out + list(final or [])


def check_mapped(vf_env: Any, vf: Any) -> None:
    """Raise ValueError naming the first part of `vf_env` the adapter cannot map (`UNMAPPED`)."""
    kind = type(vf_env).__name__
    problems = []
    if isinstance(vf_env, vf.EnvGroup):
        problems.append("EnvGroup")
    elif not isinstance(vf_env, vf.MultiTurnEnv):
        problems.append("an Environment that is not a MultiTurnEnv")
    if getattr(vf_env, "message_type", "chat") != "chat":
        problems.append("message_type='completion'")
    if isinstance(vf_env, vf.StatefulToolEnv):
        problems.append("StatefulToolEnv")
    for hook in ("get_prompt_messages", "render_completion"):
        if getattr(type(vf_env), hook, None) is not getattr(vf.MultiTurnEnv, hook):
            problems.append("get_prompt_messages / render_completion overrides")
    extra = {
        k: v
        for k, v in (vf_env.sampling_args or {}).items()
        if k not in _MAX_TOKEN_KEYS and _PASSIVE_SAMPLING.get(k, object()) != v
    }
    if extra:
        problems.append("sampling_args other than max_tokens")
    if problems:
        first = problems[0]
        detail = f" ({sorted(extra)})" if first.startswith("sampling_args") else ""
        raise ValueError(
            f"the verifiers environment {kind} uses {first}{detail}, which looprl cannot map: "
            f"{UNMAPPED[first]}"
        )


def is_plain_tool_env(vf_env: Any, vf: Any) -> bool:
    """A `vf.ToolEnv` whose tool running is verifiers' own (no `env_response`/`call_tool` override)."""
    return (
        isinstance(vf_env, vf.ToolEnv)
        and type(vf_env).env_response is vf.ToolEnv.env_response
        and type(vf_env).call_tool is vf.ToolEnv.call_tool
    )


def limits_from(vf_env: Any) -> Limits:
    """looprl limits from the env: `max_turns` (-1, no limit, keeps looprl's default of 6),
    `sampling_args["max_tokens"]` per turn, `max_seq_len` for the whole context."""
    defaults = Limits()
    max_turns = getattr(vf_env, "max_turns", -1)
    sampling = vf_env.sampling_args or {}
    per_turn = next((sampling[k] for k in _MAX_TOKEN_KEYS if sampling.get(k)), None)
    return Limits(
        max_turns=max_turns if max_turns > 0 else defaults.max_turns,
        max_tokens_per_turn=per_turn or defaults.max_tokens_per_turn,
        max_context_tokens=vf_env.max_seq_len or defaults.max_context_tokens,
    )


def rubric_from(vf_rubric: Any, env: VerifiersEnv, vf: Any) -> Rubric:
    """A looprl rubric calling every function of a (nested) verifiers rubric with its weight."""
    funcs, weights, group_funcs, group_weights = [], [], [], []
    for func, weight, objects in _flatten(vf_rubric, vf):
        if vf_rubric._is_group_func(func):
            group_funcs.append(_group_reward(func, objects, env))
            group_weights.append(float(weight))
        else:
            funcs.append(_reward(func, objects, env))
            weights.append(float(weight))
    return Rubric(funcs, weights=weights, group_funcs=group_funcs, group_weights=group_weights)


def _flatten(vf_rubric: Any, vf: Any) -> list[tuple[Callable, float, dict[str, Any]]]:
    """(function, weight, class objects) of a rubric and, recursively, of a RubricGroup's members."""
    kind = type(vf_rubric)
    if isinstance(vf_rubric, vf.RubricGroup):
        if kind.score_group is not vf.RubricGroup.score_group:
            raise ValueError(_override_error(kind))
        return [item for member in vf_rubric.rubrics for item in _flatten(member, vf)]
    if (
        kind.score_group is not vf.Rubric.score_group
        or kind.score_rollout is not vf.Rubric.score_rollout
    ):
        raise ValueError(_override_error(kind))
    objects = dict(vf_rubric.class_objects)
    return [(f, w, objects) for f, w in zip(vf_rubric.funcs, vf_rubric.weights, strict=True)]


def _override_error(kind: type) -> str:
    reason = UNMAPPED["a Rubric subclass overriding score_rollout / score_group"]
    return f"the verifiers rubric {kind.__name__} overrides score_rollout/score_group: {reason}"


def _reward(func: Callable, objects: dict[str, Any], env: VerifiersEnv) -> Callable:
    """A looprl reward `fn(episode)` calling the verifiers function with the arguments it takes."""

    async def reward(episode: EpisodeResult) -> float:
        vf_state = _vf_state(episode)
        values = dict(
            prompt=vf_state["prompt"], completion=env.completion(episode),
            answer=vf_state.get("answer", ""), state=vf_state, task=vf_state["task"],
            info=vf_state.get("info", {}), **objects,
        )  # fmt: skip
        return float(await _call(func, values))

    reward.__name__ = getattr(func, "__name__", "reward")
    return reward


def _group_reward(func: Callable, objects: dict[str, Any], env: VerifiersEnv) -> Callable:
    """A looprl group reward `fn(episodes)` calling a verifiers group function (plural names)."""

    async def reward(episodes: list[EpisodeResult]) -> list[float]:
        states = [_vf_state(ep) for ep in episodes]
        values = dict(
            prompts=[s["prompt"] for s in states],
            completions=[env.completion(ep) for ep in episodes],
            answers=[s.get("answer", "") for s in states], states=states,
            tasks=[s["task"] for s in states], infos=[s.get("info", {}) for s in states],
            **objects,
        )  # fmt: skip
        return [float(v) for v in await _call(func, values)]

    reward.__name__ = getattr(func, "__name__", "reward")
    return reward


async def _call(func: Callable, values: dict[str, Any]) -> Any:
    """Call `func` with the values it names (all of them when it takes **kwargs); await it."""
    params = inspect.signature(func).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        values = {k: v for k, v in values.items() if k in params}
    out = func(**values)
    return await out if inspect.isawaitable(out) else out


def _vf_state(episode: EpisodeResult) -> Any:
    vf_state = episode.state.get("vf_state")
    if vf_state is None:
        raise ValueError("the episode has no verifiers state (its setup_state failed)")
    return vf_state


def _to_vf(message: Message) -> dict[str, Any]:
    """A looprl message in the OpenAI chat format verifiers uses (arguments as a JSON string)."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def _from_vf(message: Any, where: str) -> Message:
    """A verifiers chat message as a looprl one; content parts (images, audio) are refused."""
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise ValueError(
            f"{where}: a {message.get('role')} message has content parts "
            f"({type(content).__name__}); looprl maps text content only"
        )
    return Message.from_dict(dict(message))
