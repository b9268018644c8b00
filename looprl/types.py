"""The records every layer shares: tasks, messages, tool calls, token-exact trajectories, results.

All records are dataclasses with `to_dict` / `from_dict` that round-trip through JSON without loss.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, TypedDict

from looprl import safe_json

Role = Literal["system", "user", "assistant", "tool"]
FinishReason = Literal["stop", "length", "error"]
StopReason = Literal["", "done", "max_turns", "max_tokens", "max_context", "timeout", "error"]
"""Why an episode ended ("" until it has): the environment said done, a limit cut it
(`max_turns`, `max_tokens` per turn, `max_context_tokens`, the wall-clock `timeout`), or an
engine or environment `error`."""


ErrorKind = Literal["infra", "rollout", "scoring"]


class EpisodeError(TypedDict):
    """One error recorded on an episode (a plain dict in files, typed in code).

    `kind` says whose fault it was: `infra` (the engine, a server, a hung tool, the wall-clock
    limit: the episode is retried by `looprl eval --resume`), `rollout` (the environment failed
    or the episode could not start), `scoring` (a reward function raised; `function` names it).
    """

    kind: ErrorKind
    message: str
    function: NotRequired[str]


@dataclass
class ToolCall:
    """One call the model asked for.

    `arguments` is the parsed JSON object; `raw` is the exact text the model wrote for the call
    (kept so malformed calls can be shown and counted). `id` links the call to its tool message.
    """

    name: str
    arguments: dict[str, Any]
    id: str = ""
    raw: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToolCall:
        """Inverse of `to_dict`."""
        return cls(**d)

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI chat format of this call (`{"type": "function", "function": {...}}`)."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass
class ToolOutcome:
    """How one tool call went, recorded on the episode for rubrics and metrics.

    `error_kind` is None for a call that ran, else the kind (`looprl.tools.ERROR_KINDS`, or the
    tool's own kind from a `ToolError`); `status` is what the tool reported of its own work (a
    sandbox's `ok`, `error`, `timeout`, `sandbox_error`...; empty when it reports nothing);
    `infra` is True when the tool, not the model's call, failed.
    """

    name: str
    call_id: str = ""
    error_kind: str | None = None
    status: str = ""
    seconds: float = 0.0
    truncated: bool = False
    infra: bool = False

    @property
    def ok(self) -> bool:
        """The call ran without a tool error."""
        return self.error_kind is None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToolOutcome:
        """Inverse of `to_dict`."""
        return cls(**d)


@dataclass
class Message:
    """One chat message.

    For an assistant message, `content` is the text outside tool-call blocks and `tool_calls` the
    parsed calls; `raw` is the exact decoded text the model sampled (empty for other roles).
    For a tool message, `tool_call_id` and `name` say which call it answers.
    """

    role: Role
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    raw: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (empty optional fields are kept so the round trip is exact)."""
        d = dataclasses.asdict(self)
        d["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Message:
        """Inverse of `to_dict`; also accepts plain OpenAI-style messages."""
        calls = []
        for c in d.get("tool_calls") or []:
            if "function" in c:  # OpenAI format
                fn = c["function"]
                args = fn.get("arguments", {})
                if isinstance(args, str):
                    args = json.loads(args) if args.strip() else {}
                calls.append(ToolCall(name=fn["name"], arguments=args, id=c.get("id", "")))
            else:
                calls.append(ToolCall.from_dict(c))
        return cls(
            role=d["role"],
            content=d.get("content") or "",
            tool_calls=calls,
            tool_call_id=d.get("tool_call_id"),
            name=d.get("name"),
            raw=d.get("raw", ""),
        )

    def to_template(self) -> dict[str, Any]:
        """The dict a Hugging Face chat template expects (OpenAI message format)."""
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            d["name"] = self.name
        return d


@dataclass
class Task:
    """One row of work: a prompt (chat messages), an optional reference answer, free-form info.

    `id` is stable across runs (used for resume, grouping and comparing steps); `env` names the
    environment the task belongs to (for mixtures).
    """

    id: str
    prompt: list[Message]
    answer: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    env: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "id": self.id,
            "prompt": [m.to_dict() for m in self.prompt],
            "answer": self.answer,
            "info": self.info,
            "env": self.env,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Task:
        """Inverse of `to_dict`; `prompt` may also be a plain string (one user message)."""
        prompt = d["prompt"]
        if isinstance(prompt, str):
            msgs = [Message(role="user", content=prompt)]
        else:
            msgs = [Message.from_dict(m) for m in prompt]
        return cls(
            id=str(d["id"]),
            prompt=msgs,
            answer=d.get("answer"),
            info=d.get("info") or {},
            env=d.get("env", ""),
        )


@dataclass
class Trajectory:
    """One training segment: flat token ids with per-token mask, sampling logprob and turn index.

    All lists have the same length T. `mask[i]` is 1 when token i was sampled by the policy (and
    is trained on), 0 for prompt, tool output, user turns and template glue. `logprobs[i]` is the
    sampler's log-probability of token i (0.0 where mask is 0). `turns[i]` is the assistant turn
    (0-based) the token belongs to or follows. An episode usually has one segment; a chat template
    that rewrites history starts another (see `looprl.rendering.renderer`).
    """

    token_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.token_ids)

    def extend(
        self, ids: list[int], *, sampled: bool, turn: int, logprobs: list[float] | None = None
    ) -> None:
        """Append tokens; sampled tokens carry mask 1 and their logprobs, others mask 0."""
        if sampled and (logprobs is None or len(logprobs) != len(ids)):
            raise ValueError("sampled tokens need one logprob each")
        self.token_ids.extend(ids)
        self.mask.extend([1 if sampled else 0] * len(ids))
        self.logprobs.extend(logprobs if sampled and logprobs is not None else [0.0] * len(ids))
        self.turns.extend([turn] * len(ids))

    @property
    def num_sampled(self) -> int:
        """Number of tokens the policy sampled (mask 1)."""
        return sum(self.mask)

    def check(self) -> None:
        """Raise ValueError if the per-token lists disagree in length or logprobs leak outside the mask."""
        n = len(self.token_ids)
        if not (len(self.mask) == len(self.logprobs) == len(self.turns) == n):
            raise ValueError("trajectory lists differ in length")
        for m, lp in zip(self.mask, self.logprobs, strict=True):
            if m == 0 and lp != 0.0:
                raise ValueError("a logprob is set on a token with mask 0")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        """Inverse of `to_dict`."""
        return cls(**d)


@dataclass
class EpisodeResult:
    """Everything one rollout produced.

    `rewards` maps each reward function (weighted or zero-weight metric) to its value; `reward`
    is the weighted total. `errors` holds `EpisodeError` records (`{"kind", "message", ...}`):
    kind `infra` (a fault outside the model and the environment's code: the engine or server
    failed, a tool hung, the episode's wall-clock limit ran out; the episode is unusable and
    `looprl eval --resume` runs its group again), `rollout` (the environment failed, or the
    episode could not start: unusable), `scoring` (a reward function raised: excluded from
    training statistics). `tool_errors` counts failed tool calls by kind; `tool_outcomes` says
    how each call went, in order. `timings` holds seconds per phase (generate, tools, score,
    total). `state` is the environment's per-episode state; what JSON can hold is saved (the
    task itself is not: it is saved once, as `task`). `policy_version` is the optimizer step
    whose weights sampled the episode (set by the trainer; None in evaluations).
    """

    task: Task
    messages: list[Message] = field(default_factory=list)
    trajectories: list[Trajectory] = field(default_factory=list)
    reward: float = 0.0
    rewards: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    errors: list[EpisodeError] = field(default_factory=list)
    tool_errors: dict[str, int] = field(default_factory=dict)
    tool_outcomes: list[ToolOutcome] = field(default_factory=list)
    num_turns: int = 0
    num_tool_calls: int = 0
    truncated: bool = False
    stop_reason: StopReason = ""
    timings: dict[str, float] = field(default_factory=dict)
    rollout_index: int = 0
    state: dict[str, Any] = field(default_factory=dict)
    policy_version: int | None = None

    @property
    def rollout_error(self) -> bool:
        """True when the rollout itself failed (infrastructure or environment), not just scoring."""
        return any(e.get("kind") in ("rollout", "infra") for e in self.errors)

    @property
    def infra_error(self) -> bool:
        """True when a fault outside the model and environment code spoiled the episode (retryable)."""
        return any(e.get("kind") == "infra" for e in self.errors)

    @property
    def scoring_error(self) -> bool:
        """True when a reward function raised while scoring this episode."""
        return any(e.get("kind") == "scoring" for e in self.errors)

    @property
    def trainable(self) -> bool:
        """Whether this episode may enter training statistics (no rollout or scoring error)."""
        return not self.errors

    @property
    def num_generated_tokens(self) -> int:
        """Tokens sampled by the policy over all segments."""
        return sum(t.num_sampled for t in self.trajectories)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "task": self.task.to_dict(),
            "messages": [m.to_dict() for m in self.messages],
            "trajectories": [t.to_dict() for t in self.trajectories],
            "reward": self.reward,
            "rewards": self.rewards,
            "metrics": self.metrics,
            "errors": self.errors,
            "tool_errors": self.tool_errors,
            "tool_outcomes": [o.to_dict() for o in self.tool_outcomes],
            "num_turns": self.num_turns,
            "num_tool_calls": self.num_tool_calls,
            "truncated": self.truncated,
            "stop_reason": self.stop_reason,
            "timings": self.timings,
            "rollout_index": self.rollout_index,
            "state": _jsonable({k: v for k, v in self.state.items() if not isinstance(v, Task)}),
            "policy_version": self.policy_version,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EpisodeResult:
        """Inverse of `to_dict`."""
        return cls(
            task=Task.from_dict(d["task"]),
            messages=[Message.from_dict(m) for m in d["messages"]],
            trajectories=[Trajectory.from_dict(t) for t in d["trajectories"]],
            reward=d["reward"],
            rewards=d["rewards"],
            metrics=d["metrics"],
            errors=d["errors"],
            tool_errors=d["tool_errors"],
            tool_outcomes=[ToolOutcome.from_dict(o) for o in d.get("tool_outcomes", [])],
            num_turns=d["num_turns"],
            num_tool_calls=d["num_tool_calls"],
            truncated=d["truncated"],
            stop_reason=d["stop_reason"],
            timings=d["timings"],
            rollout_index=d.get("rollout_index", 0),
            state=d.get("state", {}),
            policy_version=d.get("policy_version"),
        )

    def to_json(self) -> str:
        """One JSONL line of strict JSON that encodes to UTF-8 whatever the model wrote."""
        return safe_json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, line: str) -> EpisodeResult:
        """Parse one JSONL line."""
        return cls.from_dict(json.loads(line))


def _jsonable(obj: Any) -> Any:
    """Keep only the JSON-serializable part of per-episode state (handles are dropped)."""
    try:
        json.dumps(obj)
        return obj
    except (TypeError, ValueError):
        if isinstance(obj, dict):
            out = {}
            for k, v in obj.items():
                try:
                    json.dumps(v)
                    out[str(k)] = v
                except (TypeError, ValueError):
                    out[str(k)] = repr(v)
            return out
        return repr(obj)


@dataclass
class SamplingParams:
    """How to sample one assistant turn.

    Defaults follow common RL practice (temperature 1.0, no nucleus or top-k truncation, so the
    sampler's distribution is the policy's own and importance ratios stay unbiased).
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return dataclasses.asdict(self)


@dataclass
class Generation:
    """What an engine returns for one request.

    `token_ids` and `logprobs` are the sampled tokens (including a stop token if one ended the
    turn) and their sampling log-probabilities; both are empty for message-level engines, which
    return only `text` (and possibly structured `tool_calls`). `finish_reason` is `stop`,
    `length` or `error` (then `error` holds the message).
    """

    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason = "stop"
    tool_calls: list[ToolCall] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0


class Summary(TypedDict):
    """Statistics of a set of episodes (an evaluation or a training batch), as `summarize` makes them.

    Reward statistics cover the `scored_episodes` (no error of any kind); `rewards` holds the
    mean of each reward function and metric; `pass_at_k` maps `pass@k` to the unbiased
    estimate; the error counts are episodes (`rollout_errors` includes `infra_errors`);
    `tool_errors` counts failed calls by kind; `per_env` splits a mixture by environment.
    Turned into training metrics by `looprl.trainer.metrics`, into the console table by
    `looprl.console.summary_table`, and saved in `metadata.json` for the viewer.
    """

    episodes: int
    scored_episodes: int
    reward_mean: float
    reward_std: float
    rewards: dict[str, float]
    pass_at_k: dict[str, float]
    turns_mean: float
    tool_calls_mean: float
    tool_errors: dict[str, int]
    truncated: int
    stop_reasons: dict[str, int]
    rollout_errors: int
    infra_errors: int
    scoring_errors: int
    error_messages: list[str]
    template_breaks: int
    per_env: NotRequired[dict[str, dict[str, Any]]]
    generated_tokens: int
    generated_tokens_mean: float
    generate_seconds: NotRequired[float]
    tokens_per_second: NotRequired[float]
