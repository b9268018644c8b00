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
    """One error recorded on an episode (a plain dict in files); `EpisodeResult` says each kind."""

    kind: ErrorKind
    """Whose fault: `infra`, `rollout` or `scoring`."""
    message: str
    """What went wrong, in one line."""
    function: NotRequired[str]
    """The reward function that raised (`scoring` errors only)."""


@dataclass
class ToolCall:
    """One call the model asked for."""

    name: str
    """The tool the model named."""
    arguments: dict[str, Any]
    """The parsed JSON object of arguments."""
    id: str = ""
    """Links the call to the tool message that answers it (`call_0`, ...)."""
    raw: str = ""
    """The exact text the model wrote for this call (to show and count bad calls)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToolCall:
        """Inverse of `to_dict`."""
        return cls(**d)

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI chat format of this call (`{"type": "function", "function": {...}}`)."""
        function = {"name": self.name, "arguments": self.arguments}
        return {"id": self.id, "type": "function", "function": function}


@dataclass
class ToolOutcome:
    """How one tool call went, recorded on the episode for rubrics and metrics."""

    name: str
    """The tool called (as the model wrote it)."""
    call_id: str = ""
    """The id of the call this outcome answers."""
    error_kind: str | None = None
    """None when the call ran; else a `looprl.tools.ERROR_KINDS` kind or a `ToolError`'s kind."""
    status: str = ""
    """The tool's own status from a `ToolReply` (a sandbox's `ok`, `timeout`...; "" if none)."""
    seconds: float = 0.0
    """Wall time of the call."""
    truncated: bool = False
    """The result was cut to the environment's `max_tool_result_chars`."""
    infra: bool = False
    """The tool, not the model's call, failed (timeout, unavailable, `infra=True`)."""

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
    """One chat message (the fields below say which apply to which role)."""

    role: Role
    """`system`, `user`, `assistant` or `tool`."""
    content: str = ""
    """The text (for an assistant: the text outside tool-call blocks)."""
    tool_calls: list[ToolCall] = field(default_factory=list)
    """An assistant message's well-formed tool calls, in order."""
    tool_call_id: str | None = None
    """A tool message: the id of the call it answers."""
    name: str | None = None
    """A tool message: the tool that answered."""
    raw: str = ""
    """An assistant message: the exact decoded text the model sampled."""
    reasoning_content: str = ""
    """An assistant message: its leading reasoning block (`<think>`), not part of `content`."""

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
            reasoning_content=d.get("reasoning_content") or "",
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
    """One row of work: a prompt (chat messages), an optional reference answer, free-form info."""

    id: str
    """Stable across runs: seeds sampling, groups rollouts, resumes, compares steps."""
    prompt: list[Message]
    """The chat messages the episode starts from (system prompt included)."""
    answer: str | None = None
    """The reference answer, for the rubric (None when there is none)."""
    info: dict[str, Any] = field(default_factory=dict)
    """Free-form JSON the rewards may read (e.g. gold document ids)."""
    env: str = ""
    """The member environment of a mixture ("" otherwise)."""

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

    All lists have the same length T. An episode usually has one segment; a chat template that
    rewrites history starts another (see `looprl.rendering.renderer`).
    """

    token_ids: list[int] = field(default_factory=list)
    """The segment's tokens, prompt and completions, in order: (T,)."""
    mask: list[int] = field(default_factory=list)
    """1 on tokens the policy sampled (trained); 0 on prompt, tool, user and template tokens: (T,)."""
    logprobs: list[float] = field(default_factory=list)
    """The sampler's log-probability of each sampled token, 0.0 where mask is 0: (T,)."""
    turns: list[int] = field(default_factory=list)
    """The assistant turn (0-based) each token belongs to or follows: (T,)."""

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
    """The task played."""
    messages: list[Message] = field(default_factory=list)
    """The whole conversation: the task's prompt, then every turn as appended."""
    trajectories: list[Trajectory] = field(default_factory=list)
    """Token-level segments (empty with a message-level engine)."""
    reward: float = 0.0
    """The weighted total of the rubric's reward functions."""
    rewards: dict[str, float] = field(default_factory=dict)
    """Each reward function's and metric's value, by function name."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Rollout metrics (`template_breaks`; `prompt_tokens` and `completion_tokens` summed over the
    turns when the engine reported a server's `usage`)."""
    errors: list[EpisodeError] = field(default_factory=list)
    """`EpisodeError` records; an episode with any is kept out of training."""
    tool_errors: dict[str, int] = field(default_factory=dict)
    """Failed tool calls by kind, plus `truncated` for cut results."""
    tool_outcomes: list[ToolOutcome] = field(default_factory=list)
    """How each tool call (and malformed block) went, in order, last turn included."""
    num_turns: int = 0
    """Assistant turns sampled."""
    num_tool_calls: int = 0
    """Tool-call blocks the model wrote, malformed ones included."""
    truncated: bool = False
    """A limit cut the episode (`max_turns`, `max_tokens`, `max_context`, `timeout`)."""
    stop_reason: StopReason = ""
    """Why the episode ended (see `StopReason`)."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds per phase: `generate`, `env`, `score`, `total`."""
    rollout_index: int = 0
    """Which of the task's group of rollouts this is (0-based)."""
    state: dict[str, Any] = field(default_factory=dict)
    """The environment's per-episode state at the end (what JSON can hold is saved)."""
    policy_version: int | None = None
    """The optimizer step whose weights sampled it (None in evaluations)."""

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
        """Tokens sampled by the policy over all segments; for a message-level engine (no token
        ids) the server's count, `metrics["completion_tokens"]`, when it reported one."""
        sampled = sum(t.num_sampled for t in self.trajectories)
        return sampled or int(self.metrics.get("completion_tokens", 0))

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
            "state": safe_json.jsonable_part(
                {k: v for k, v in self.state.items() if not isinstance(v, Task)}
            ),
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


@dataclass
class SamplingParams:
    """How to sample one assistant turn.

    Defaults follow common RL practice (temperature 1.0, no nucleus or top-k truncation, so the
    sampler's distribution is the policy's own and importance ratios stay unbiased).
    """

    max_tokens: int = 256
    """Most tokens to sample in the turn (the rollout lowers it to fit the limits)."""
    temperature: float = 1.0
    """Softmax temperature; 0 is greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass; 1.0 keeps the whole distribution."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 keeps all."""
    stop: list[str] = field(default_factory=list)
    """Strings that end the turn."""
    seed: int | None = None
    """Sampling seed (the rollout sets one per task, rollout and turn)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return dataclasses.asdict(self)


@dataclass
class Generation:
    """What an engine returns for one request (message-level engines fill only the text fields)."""

    text: str
    """The sampled text."""
    token_ids: list[int] = field(default_factory=list)
    """The sampled ids, a stop token included if one ended the turn (empty: message-level)."""
    logprobs: list[float] = field(default_factory=list)
    """The sampling log-probability of each sampled token."""
    finish_reason: FinishReason = "stop"
    """`stop`, `length` (the token budget ran out) or `error`."""
    tool_calls: list[ToolCall] = field(default_factory=list)
    """Structured calls a message-level engine returned besides the text."""
    error: str | None = None
    """The failure, when `finish_reason` is `error`."""
    seconds: float = 0.0
    """Wall time of the request."""
    prompt_tokens: int | None = None
    """Prompt tokens as the server counted them (its response's `usage`); None when unknown."""
    completion_tokens: int | None = None
    """Sampled tokens as the server counted them (`usage`); None when unknown. Token-level
    engines' own count is `len(token_ids)`."""
    versions: list[int] = field(default_factory=list)
    """The policy version whose weights sampled each token of `token_ids` (one per token); empty
    when the engine does not track it (one version, the episode's `policy_version`, sampled all)."""


class Summary(TypedDict):
    """Statistics of a set of episodes (an evaluation or a training batch), as `summarize` makes them.

    Turned into training metrics by `looprl.trainer.metrics`, into the console table by
    `looprl.console.summary_table`, and saved in `metadata.json` for the viewer.
    """

    episodes: int
    """Episodes summarised."""
    scored_episodes: int
    """Episodes without any error (reward statistics cover these)."""
    reward_mean: float
    """Mean total reward over scored episodes."""
    reward_std: float
    """Standard deviation of the total reward over scored episodes."""
    rewards: dict[str, float]
    """Mean of each reward function and metric."""
    pass_at_k: dict[str, float]
    """`pass@k` -> the unbiased estimate."""
    turns_mean: float
    """Mean assistant turns per episode."""
    tool_calls_mean: float
    """Mean `num_tool_calls` per episode (malformed blocks included)."""
    tool_errors: dict[str, int]
    """Failed tool calls by kind, over all episodes."""
    truncated: int
    """Episodes a limit cut."""
    stop_reasons: dict[str, int]
    """Episodes per stop reason."""
    rollout_errors: int
    """Episodes with a `rollout` or `infra` error (so `infra_errors` is a part of it)."""
    infra_errors: int
    """Episodes with an `infra` error (retried by `looprl eval --resume`)."""
    scoring_errors: int
    """Episodes whose reward function raised."""
    error_messages: list[str]
    """The most frequent error messages, as `Nx kind: message` (at most five)."""
    template_breaks: int
    """Extra training segments started because a chat template rewrote history."""
    per_env: NotRequired[dict[str, dict[str, Any]]]
    """A mixture's statistics by member environment."""
    generated_tokens: int
    """Tokens sampled over all episodes."""
    generated_tokens_mean: float
    """Tokens sampled per episode."""
    generate_seconds: NotRequired[float]
    """Seconds spent generating."""
    tokens_per_second: NotRequired[float]
    """Sampled tokens per second of generation."""
    prompt_tokens: NotRequired[int]
    """Prompt tokens over all requests, as a server counted them (only when it reported them)."""
