"""OpenEnv environments (`openenv-core`'s Gym-style `Environment`) as looprl multi-turn ones.

`openenv:MODULE[:CLASS]` names an `openenv.core.env_server.interfaces.Environment` subclass
(CLASS may be left out when MODULE defines exactly one). The mapping, turn by turn:

- task: a seed. `reset(seed=s)` gives the first observation, rendered as the user message of
  the task's prompt (after `system_prompt`, if given). Each episode builds its own instance and
  resets it with the task's seed; its first observation must render the same (a group of
  rollouts shares one prompt), else the episode is a rollout error saying so;
- action: the model's reply text (reasoning and tool-call blocks left out) fills one string
  field of the environment's Action class (`action_field`; found alone when the Action has
  exactly one required field besides `metadata`); a reply the Action rejects is answered with
  the validation error as a user message, and the episode goes on;
- observation: after each `step`, the observation's fields other than `done`, `reward` and
  `metadata` become the next user message (`observation_field` picks one field; one field
  alone is shown as its text, several as JSON); `done=True` ends the episode;
- reward: `openenv_return`, the sum of the steps' `reward` (None counts 0), weight 1; metrics
  `openenv_steps` and `openenv_done` (the environment, not a looprl limit, ended it). The
  environment's own `rubric` and `transform` run inside its `step`, so they reach the reward;
- `state` is saved on the episode (`openenv_state`, its JSON dump); `close()` runs at the end.
  A class with `SUPPORTS_CONCURRENT_SESSIONS = False` runs one episode at a time.

Keyword arguments the adapter does not take go to CLASS's constructor.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import typing
import uuid
from typing import Any

from looprl.envs.base import Environment, Limits, StepOutcome
from looprl.envs.foreign.common import import_environment_module, require
from looprl.rendering.parser import ParsedTurn
from looprl.rubrics import Rubric
from looprl.types import EpisodeResult, Message, Task

UNMAPPED = {
    "MCPEnvironment": "its tools come over MCP; give looprl the MCP server as tools instead",
    "EnvClient": "remote (HTTP/WebSocket/Docker) clients are not mapped; name the server-side "
    "Environment class and run it in-process",
    "an Action without one string field": "looprl maps the reply text to one string field",
}
"""Parts of the OpenEnv API the adapter refuses, with the way out."""

EVAL_SEED_BASE = 1_000_000  # eval tasks use seeds from here, apart from the training seeds
_RESERVED = ("done", "reward", "metadata")


def load_openenv_environment(
    target: str,
    *,
    num_train_tasks: int = 32,
    num_eval_tasks: int = 8,
    system_prompt: str | None = None,
    action_field: str | None = None,
    observation_field: str | None = None,
    max_turns: int = 6,
    max_tokens_per_turn: int = 256,
    **env_kwargs: Any,
) -> OpenEnvEnv:
    """Wrap the OpenEnv class named by `MODULE[:CLASS]`; `env_kwargs` go to its constructor."""
    require("openenv", "openenv", f"openenv:{target}")
    cls = find_class(target)
    return OpenEnvEnv(
        cls,
        name=f"openenv:{target}",
        env_kwargs=env_kwargs,
        num_train_tasks=num_train_tasks,
        num_eval_tasks=num_eval_tasks,
        system_prompt=system_prompt,
        action_field=action_field,
        observation_field=observation_field,
        limits=Limits(max_turns=max_turns, max_tokens_per_turn=max_tokens_per_turn),
    )


def find_class(target: str) -> type:
    """The OpenEnv Environment class of `MODULE[:CLASS]` (a .py path may hold a colon too)."""
    from openenv.core.env_client import EnvClient
    from openenv.core.env_server.interfaces import Environment as OpenEnvBase

    module_name, _, class_name = target.rpartition(":") if ":" in target else (target, "", "")
    module = import_environment_module(module_name)
    if class_name:
        cls = getattr(module, class_name, None)
        if cls is None:
            raise ValueError(f"{module_name} has no class {class_name!r}")
    else:
        found = [
            v
            for v in vars(module).values()
            if inspect.isclass(v) and issubclass(v, OpenEnvBase) and v.__module__ == module.__name__
        ]
        if len(found) != 1:
            names = sorted(c.__name__ for c in found)
            raise ValueError(
                f"{module_name} defines {len(found)} OpenEnv Environment classes {names}; "
                f"name one: openenv:{module_name}:CLASS"
            )
        cls = found[0]
    if inspect.isclass(cls) and issubclass(cls, EnvClient):
        raise ValueError(f"openenv:{target} is an EnvClient: {UNMAPPED['EnvClient']}")
    if not (inspect.isclass(cls) and issubclass(cls, OpenEnvBase)):
        raise ValueError(f"openenv:{target} is not an OpenEnv Environment subclass")
    if any(base.__name__ == "MCPEnvironment" for base in cls.__mro__):
        raise ValueError(f"openenv:{target} is an MCPEnvironment: {UNMAPPED['MCPEnvironment']}")
    return cls


def action_class(cls: Any) -> Any:
    """The Action class `cls.step` takes (its annotation, else the generic argument)."""
    from openenv.core.env_server.types import Action

    hint = typing.get_type_hints(cls.step).get("action")
    candidates = [hint] + [
        arg for base in getattr(cls, "__orig_bases__", ()) for arg in typing.get_args(base)
    ]
    for c in candidates:
        if inspect.isclass(c) and issubclass(c, Action) and c is not Action:
            return c
    raise ValueError(
        f"cannot tell which Action class {cls.__name__}.step takes; annotate it "
        "(def step(self, action: MyAction, ...))"
    )


def pick_action_field(action_cls: Any, wanted: str | None) -> str:
    """The string field of the Action that the reply text fills (see the module docstring)."""
    fields = {k: f for k, f in action_cls.model_fields.items() if k != "metadata"}
    required = [k for k, f in fields.items() if f.is_required()]
    if wanted is None:
        if len(required) != 1:
            raise ValueError(
                f"{action_cls.__name__} has required fields {required}; "
                f"{UNMAPPED['an Action without one string field']}: pass action_field (--env."
                "action_field NAME) naming a str field, the others needing no value"
            )
        wanted = required[0]
    if wanted not in fields:
        raise ValueError(
            f"action_field {wanted!r} is not a field of {action_cls.__name__}: {sorted(fields)}"
        )
    if fields[wanted].annotation is not str or set(required) - {wanted}:
        raise ValueError(
            f"action_field {wanted!r} of {action_cls.__name__} must be a str field and the only "
            f"required one (required: {required}): {UNMAPPED['an Action without one string field']}"
        )
    return wanted


def render_observation(observation: Any, field: str | None) -> str:
    """The user message an observation becomes (see the module docstring)."""
    data = observation.model_dump(exclude=set(_RESERVED))
    if field is not None:
        if field not in data:
            raise ValueError(f"observation_field {field!r} is not a field of {sorted(data)}")
        data = {field: data[field]}
    if len(data) == 1:
        (value,) = data.values()
        return value if isinstance(value, str) else json.dumps(value, default=str)
    return json.dumps(data, default=str)


class OpenEnvEnv(Environment):
    """A looprl multi-turn environment stepping one OpenEnv instance per episode."""

    def __init__(
        self,
        cls: type,
        *,
        name: str,
        env_kwargs: dict[str, Any],
        num_train_tasks: int,
        num_eval_tasks: int,
        system_prompt: str | None,
        action_field: str | None,
        observation_field: str | None,
        limits: Limits,
    ) -> None:
        if num_train_tasks < 1 or num_eval_tasks < 0:
            raise ValueError("num_train_tasks must be >= 1 and num_eval_tasks >= 0")
        self.cls = cls
        self.env_kwargs = env_kwargs
        self.action_cls = action_class(cls)
        self.action_field = pick_action_field(self.action_cls, action_field)
        self.observation_field = observation_field
        self._lock = None if getattr(cls, "SUPPORTS_CONCURRENT_SESSIONS", False) else asyncio.Lock()
        rubric = Rubric([openenv_return, openenv_steps, openenv_done], weights=[1.0, 0.0, 0.0])
        super().__init__(
            name=name,
            rubric=rubric,
            train_tasks=[self._task(s) for s in range(num_train_tasks)],
            eval_tasks=[self._task(EVAL_SEED_BASE + s) for s in range(num_eval_tasks)],
            limits=limits,
            system_prompt=system_prompt,
        )

    def _new(self) -> Any:
        try:
            return self.cls(**self.env_kwargs)
        except TypeError as exc:
            raise ValueError(
                f"{self.cls.__name__}({', '.join(sorted(self.env_kwargs))}) failed: {exc}"
            ) from exc

    def _task(self, seed: int) -> Task:
        """The task of one seed: the first observation of a fresh instance reset with it."""
        instance = self._new()
        try:
            observation = instance.reset(seed=seed)
        finally:
            instance.close()
        text = render_observation(observation, self.observation_field)
        return Task(
            id=f"seed-{seed}", prompt=[Message(role="user", content=text)], info={"seed": seed}
        )

    async def setup_state(self, task: Task) -> dict[str, Any]:
        """A fresh instance reset with the task's seed (its first observation must match)."""
        state = await super().setup_state(task)
        if self._lock is not None:
            await self._lock.acquire()  # released in cleanup_state
            state["openenv_locked"] = True
        try:
            instance = self._new()
            state.update(openenv=instance, openenv_rewards=[], openenv_done=False)
            episode_id = f"{task.id}-{uuid.uuid4().hex[:8]}"
            first = await instance.reset_async(seed=task.info["seed"], episode_id=episode_id)
        except BaseException:
            await self.cleanup_state(state)
            raise
        text = render_observation(first, self.observation_field)
        if text != task.prompt[-1].content:
            raise ValueError(
                f"{self.cls.__name__}.reset(seed={task.info['seed']}) gave another first "
                "observation than when the task was made; looprl needs reset(seed) to be "
                "deterministic so that a group of rollouts shares one prompt"
            )
        return state

    async def cleanup_state(self, state: dict[str, Any]) -> None:
        """Save the instance's `state`, close it, and let the next episode in (if serialized)."""
        instance = state.pop("openenv", None)
        try:
            if instance is not None:
                state["openenv_state"] = instance.state.model_dump(mode="json")
                instance.close()
        finally:
            if state.pop("openenv_locked", False) and self._lock is not None:
                self._lock.release()

    async def step(
        self, messages: list[Message], parsed: ParsedTurn, state: dict[str, Any]
    ) -> StepOutcome:
        """Turn the reply into an Action, step, and show the next observation (or end)."""
        from pydantic import ValidationError

        try:
            action = self.action_cls(**{self.action_field: parsed.content})
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()
            )
            reply = f"Invalid action ({problems}). Try again."
            return StepOutcome(messages=[Message(role="user", content=reply)])
        observation = await state["openenv"].step_async(action)
        state["openenv_rewards"].append(float(observation.reward or 0.0))
        if observation.done:
            state["openenv_done"] = True
            return StepOutcome(done=True)
        text = render_observation(observation, self.observation_field)
        return StepOutcome(messages=[Message(role="user", content=text)])


def openenv_return(episode: EpisodeResult) -> float:
    """The sum of the rewards the environment gave at each step."""
    return float(sum(episode.state.get("openenv_rewards", [])))


def openenv_steps(episode: EpisodeResult) -> float:
    """How many steps the environment took."""
    return float(len(episode.state.get("openenv_rewards", [])))


def openenv_done(episode: EpisodeResult) -> float:
    """1.0 when the environment ended the episode (`done`), 0.0 when a looprl limit did."""
    return float(episode.state.get("openenv_done", False))
