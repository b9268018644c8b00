"""The `[bootstrap]` section: how `looprl bootstrap` samples, keeps successes, fine-tunes and stops."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class BootstrapSection(BaseModel):
    """Self-bootstrap before RL (`looprl bootstrap`): sample, keep successes, SFT, repeat."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    attempts: int = Field(
        16,
        ge=1,
        description="samples per task each round (pass@k up to this k); more finds rarer "
        "successes (ReST-EM samples 32 per problem)",
    )
    probe_attempts: int = Field(
        0,
        ge=0,
        description="with rationalize: sample this many attempts of each task first and the "
        "rest of `attempts` only if one of them succeeds (0: all at once); a round the model "
        "cannot yet pass alone then spends its samples on hinted attempts instead of "
        "confirming a pass rate of 0",
    )
    tasks: int = Field(
        64,
        ge=1,
        description="training tasks per round, a new slice of the seeded stream each round",
    )
    attempt_temperature: float = Field(
        1.0,
        gt=0,
        description="sampling temperature of the attempts (1.0: the policy itself; raise it when "
        "no attempt succeeds; named apart from rollout.temperature, which GRPO samples at)",
    )
    max_rounds: int = Field(
        4,
        ge=1,
        description="rounds at most; each samples, and each but the last fine-tunes (the last "
        "measures the model the one before trained)",
    )
    success_threshold: float = Field(
        1.0, description="reward at or above which an attempt is kept (the rubric decides)"
    )
    max_per_task: int = Field(
        4,
        ge=1,
        description="distinct successes kept per task and round, so easy tasks do not dominate "
        "the data (ReST-EM caps at 10)",
    )
    min_gain: float = Field(
        0.01,
        ge=0,
        description="stop when a round's pass@1 does not beat the best round's by this much; the "
        "model the best round sampled is handed over",
    )
    handover_signal: float = Field(
        0.3,
        gt=0,
        le=1,
        description="stop once this fraction of GRPO groups (rollout.rollouts_per_task samples) "
        "is expected to have non-zero reward variance: RL has signal from there",
    )
    sft_epochs: float = Field(
        2.0, gt=0, description="passes over the kept successes in each round's fine-tuning"
    )
    sft_lr: float = Field(
        1e-4,
        gt=0,
        description="AdamW peak learning rate of each round's fine-tuning (1e-4: the SmolLM2 "
        "warm start in examples/calculator_smollm2.toml; make demo fine-tunes the tiny model at "
        "1e-3)",
    )
    sft_batch_size: int = Field(16, ge=1, description="conversations per fine-tuning step")
    sft_from: Literal["start", "previous"] = Field(
        "start",
        description="what each round fine-tunes: 'start', the starting model on every success "
        "kept so far (ReST-EM; a round's fine-tune grows with all rounds' data); 'previous', the "
        "model the round before trained on this round's new successes only (a round's "
        "fine-tune is the size of its own data)",
    )
    rationalize: bool = Field(
        False,
        description="STaR's rationalisation: a task none of whose attempts succeeded is tried "
        "again with the environment's hint (e.g. --env.kwargs.hint_style answer), and those "
        "successes are fine-tuned on with a note hint left out (a hinted tool call stays, as "
        "the model's own turn); pass rates count the unhinted attempts only",
    )
    hinted_attempts: int = Field(
        4, ge=1, description="samples per failed task with its hint (bootstrap.rationalize)"
    )
    teacher_base_url: str | None = Field(
        None,
        description="an OpenAI-compatible server (http://HOST:PORT/v1) that samples round 1 "
        "instead of the model: its successes warm-start the model, which samples itself after",
    )
    teacher_model: str | None = Field(
        None, description="the model the teacher server serves (its /models lists it)"
    )
    teacher_api_key_var: str | None = Field(
        None, description="environment variable holding the teacher server's API key"
    )

    @model_validator(mode="after")
    def _teacher_complete(self) -> BootstrapSection:
        if (self.teacher_base_url is None) != (self.teacher_model is None):
            raise ValueError(
                "bootstrap.teacher_base_url and bootstrap.teacher_model go together; set both "
                "to sample round 1 from a server, or neither"
            )
        if self.teacher_base_url is not None and self.max_rounds < 2:
            raise ValueError(
                "bootstrap.max_rounds must be >= 2 with a teacher: round 1 samples the teacher, "
                "a later round measures the model it trained"
            )
        return self

    @model_validator(mode="after")
    def _probe_below_attempts(self) -> BootstrapSection:
        if self.probe_attempts >= self.attempts:
            raise ValueError(
                f"bootstrap.probe_attempts ({self.probe_attempts}) must be below "
                f"bootstrap.attempts ({self.attempts}): it is the first part of them; set it "
                "lower, or 0 to sample every attempt at once"
            )
        if self.probe_attempts and not self.rationalize:
            raise ValueError(
                "bootstrap.probe_attempts needs bootstrap.rationalize true: a round whose probe "
                "finds no success spends its samples on hinted attempts; without them, rare "
                "successes are all a round has, so sample every attempt (probe_attempts 0)"
            )
        return self
