"""Small environments written in the OpenEnv API (not looprl's), for tests/test_foreign_envs.py.

`EchoLength` rewards each reply by its length (so a random tiny model's samples differ) and ends
after `max_steps` steps; `Countdown` asks for a number (an int-validated field) and is done once
it is said; `Serial` counts how many of its instances run at once (no concurrent sessions).
"""

from __future__ import annotations

import random
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class EchoAction(Action):
    """The reply to echo."""

    message: str = Field(..., description="Text to echo back")


class EchoObservation(Observation):
    """What the environment says back."""

    echoed_message: str = ""


class EchoLength(Environment):
    """Echoes replies; reward = reply length / 100, capped at 1; `max_steps` steps per episode."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, max_steps: int = 2):
        super().__init__()
        self.max_steps = max_steps
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs) -> EchoObservation:
        """A prompt that depends on the seed."""
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        word = random.Random(seed).choice(["apple", "pear", "plum", "fig"])
        return EchoObservation(echoed_message=f"Say something about {word}.")

    def step(self, action: EchoAction, timeout_s=None, **kwargs) -> EchoObservation:
        """Echo the message back with a length reward."""
        self._state.step_count += 1
        return EchoObservation(
            echoed_message=f"You said: {action.message}",
            reward=min(len(action.message), 100) / 100,
            done=self._state.step_count >= self.max_steps,
        )

    @property
    def state(self) -> State:
        """Episode id and step count."""
        return self._state


class CountAction(Action):
    """A number, written by the model as text."""

    number: str = Field(..., pattern=r"^\d+$")


class CountObservation(Observation):
    """The target and the last guess."""

    target: int = 0
    last: str = ""


class Countdown(Environment):
    """Say the target number (seed % 10); reward 1 when said, then done."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(step_count=0)
        self._target = 0

    def reset(self, seed=None, episode_id=None, **kwargs) -> CountObservation:
        """Pick the target from the seed."""
        self._target = (seed or 0) % 10
        self._state = State(episode_id=episode_id, step_count=0)
        return CountObservation(target=self._target)

    def step(self, action: CountAction, timeout_s=None, **kwargs) -> CountObservation:
        """Reward 1 and done when the number is the target."""
        self._state.step_count += 1
        hit = int(action.number) == self._target
        return CountObservation(
            target=self._target, last=action.number, reward=float(hit), done=hit
        )

    @property
    def state(self) -> State:
        """Episode id and step count."""
        return self._state


class Serial(EchoLength):
    """EchoLength that cannot share a process with another live session."""

    SUPPORTS_CONCURRENT_SESSIONS = False
    live = 0
    most = 0

    def reset(self, seed=None, episode_id=None, **kwargs) -> EchoObservation:
        """Count this live session (only for episodes: tasks are made with episode_id=None)."""
        if episode_id is not None:
            Serial.live += 1
            Serial.most = max(Serial.most, Serial.live)
        return super().reset(seed, episode_id)

    def close(self) -> None:
        """End this session."""
        if self._state.episode_id and Serial.live:
            Serial.live -= 1
