"""Where rollouts are sampled: the `[engine]` section shared by `looprl train` and `looprl eval`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class EngineSection(BaseModel):
    """Where rollouts are sampled: in process (torch) or on vLLM servers."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    kind: Literal["torch", "vllm"] = Field(
        "torch", description="torch: in-process TorchEngine (the default); vllm: vLLM servers"
    )
    base_urls: list[str] = Field(
        default_factory=list,
        description="vllm: servers you started (http://host:port/v1, --served-model-name policy, "
        "VLLM_SERVER_DEV_MODE=1), never stopped by looprl; empty: looprl starts its own",
    )
    num_servers: int = Field(1, ge=1, description="vllm: servers looprl starts")
    startup_timeout: float = Field(
        300.0, gt=0, description="vllm: seconds to wait for a started server's /health"
    )
    max_concurrency: int = Field(
        64,
        ge=1,
        description="requests in flight per vLLM server; torch: sequences decoded together (its "
        "KV-cache slots)",
    )
    kv_cache_mb: int | None = Field(
        None,
        ge=1,
        description="torch: memory for the KV cache; requests wait when the sequences decoding "
        "could outgrow it (unset: a quarter of the RAM, or of the GPU's memory)",
    )

    @field_validator("base_urls", mode="before")
    @classmethod
    def _split_urls(cls, v: Any) -> Any:
        return [u for u in v.split(",") if u] if isinstance(v, str) else v
