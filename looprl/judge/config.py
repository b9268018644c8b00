"""How a TOML file or an environment names an LLM judge: `JudgeConfig`, `make_judge`, `attach_judge`.

Any environment takes a judge through the `judge` argument, which the registry hands to
`judge_option` (a row of `looprl.envs.registry.OPTIONS`) and which adds the judge to its rubric::

    [env.kwargs]
    judge = { kind = "openai", base_url = "http://localhost:8000/v1", model = "Qwen3-8B", weight = 0.5 }

or `--env.judge '{"kind": "torch", "model": "smollm2-135m", "weight": 0}'` on the command line
(weight 0: a logged metric that does not enter the reward).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from looprl.engines.factory import side_engine
from looprl.judge.rubric import JudgeRubric
from looprl.types import SamplingParams

if TYPE_CHECKING:
    from looprl.envs.base import Environment


class JudgeConfig(BaseModel):
    """One LLM judge: where it runs, what it is asked, and its weight in the rubric."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["openai", "torch"] = Field(
        "openai", description="openai: an OpenAI-compatible server; torch: a local model in process"
    )
    model: str = Field(
        description="openai: the served model name; torch: tiny, smollm2-135m or a model directory"
    )
    base_url: str | None = Field(None, description="openai: the server's /v1 URL")
    template: str | None = Field(
        None, description="judge prompt with {question} {reference} {candidate} {fence}; "
        "default: looprl.judge.rubric.HARDENED_TEMPLATE (PLAIN_TEMPLATE when not hardened)",
    )  # fmt: skip
    hardened: bool = Field(True, description="quote, fence and neutralise the candidate")
    weight: float = Field(1.0, description="weight in the rubric (0: a logged metric only)")
    name: str = Field("judge", description="the reward's name in the rubric and the logs")
    scale: float = Field(10.0, gt=0, description="what a bare score is out of (SCORE: 7 -> 0.7)")
    max_tokens: int = Field(
        256, ge=1, description="judge reply budget (room to reason, then score)"
    )
    temperature: float = Field(0.0, ge=0, description="0: greedy, so a cached reply is the reply")
    max_concurrency: int = Field(8, ge=1, description="judge calls in flight at once")
    timeout_s: float = Field(60.0, gt=0, description="seconds per judge call attempt")
    max_retries: int = Field(2, ge=0, description="retries after a timeout or an engine error")
    cache_size: int = Field(4096, ge=0, description="judgements kept in memory (0: no cache)")
    cache_path: str | None = Field(None, description="JSONL file that keeps judgements across runs")

    @model_validator(mode="after")
    def _needs_url(self) -> JudgeConfig:
        if self.kind == "openai" and not self.base_url:
            raise ValueError(
                "an openai judge needs base_url (the server's /v1 URL, e.g. "
                "http://localhost:8000/v1); or use kind = 'torch' for a local model"
            )
        return self


def judge_config(spec: JudgeConfig | dict[str, Any]) -> JudgeConfig:
    """Validate a judge given as a dict (a TOML table), with an error naming the bad field."""
    if isinstance(spec, JudgeConfig):
        return spec
    if not isinstance(spec, dict):
        raise ValueError(
            f"judge must be a table such as {{kind = 'openai', base_url = ..., model = ...}}, "
            f"got {type(spec).__name__}"
        )
    try:
        return JudgeConfig(**spec)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'judge'}: {e['msg']}" for e in exc.errors()
        )
        raise ValueError(f"bad judge config: {problems}") from None


def make_judge(spec: JudgeConfig | dict[str, Any]) -> JudgeRubric:
    """Build the `JudgeRubric` a config names (a torch judge loads its model here)."""
    cfg = judge_config(spec)
    engine, tokenizer = side_engine(
        cfg.kind, cfg.model, cfg.base_url, cfg.max_concurrency, cfg.timeout_s
    )
    sampling = SamplingParams(max_tokens=cfg.max_tokens, temperature=cfg.temperature)
    return JudgeRubric(
        engine, tokenizer=tokenizer, template=cfg.template, hardened=cfg.hardened, name=cfg.name,
        model=cfg.model, sampling=sampling, scale=cfg.scale, max_concurrency=cfg.max_concurrency,
        timeout_s=cfg.timeout_s, max_retries=cfg.max_retries, cache_size=cfg.cache_size,
        cache_path=cfg.cache_path,
    )  # fmt: skip


def attach_judge(env: Environment, spec: JudgeConfig | dict[str, Any]) -> JudgeRubric:
    """Add the judge a config names to `env`'s rubric with its weight (to every member of a mixture)."""
    cfg = judge_config(spec)
    judge = make_judge(cfg)
    members = getattr(env, "envs", None)
    for target in members.values() if isinstance(members, dict) else [env]:
        target.rubric.add(judge, cfg.weight)
    return judge


def judge_option(spec: JudgeConfig | dict[str, Any]) -> Callable[[Environment], JudgeRubric]:
    """The environment argument `judge` (`looprl.envs.registry.OPTIONS`): the config is checked
    now, before the environment is built; the returned function attaches the judge to it."""
    cfg = judge_config(spec)
    return lambda env: attach_judge(env, cfg)
