"""vLLM's token-in/token-out endpoint as a client: sampled ids, logprobs and each token's weights.

`VLLMTokenClient` POSTs `/inference/v1/generate` (vLLM 0.32, a server started with
`--enable-scale-out`) with the prompt ids and vLLM's sampling parameters. The answer carries the
sampled ids, their logprobs (after temperature: the server runs with
`--logprobs-mode processed_logprobs`) and `weight_versions`: spans of output tokens, each with the
label of the weights that sampled them. vLLM stamps every engine step's output with the label
current at that step, and `VLLMEngine` sets the label to the policy version while generation is
paused for a sync, so `Generation.versions` is exact to the token for a request that ran across
an in-flight update. A label that is not an integer (`"default"`: a server no looprl sync has
labelled yet) leaves `versions` empty (unknown: the episode's `policy_version`).

A request vLLM aborted (`finish_reason` `abort`: an adapter sync aborts the requests in flight,
since a running request cannot change adapter) is sent again with its sampled tokens appended to
the prompt and the rest of its token budget, under the adapter named now: the tokens kept are
exactly those sampled before the abort, and the rest are sampled by the new adapter over the
whole context. With adapters, a submission's tokens carry the version of the adapter it named
(`adapter_version`), which stays exact for a request sent just before a sync that reaches the
server after it.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from looprl.engines.base import GenerationRequest
from looprl.engines.openai_engine import OpenAIEngine, RequestFailed, check_sampled
from looprl.types import Generation, SamplingParams

GENERATE_PATH = "/inference/v1/generate"
MAX_RESUBMITS = 8  # aborts in a row (one per adapter sync) before a request counts as failed


class VLLMTokenClient(OpenAIEngine):
    """Sample token-level turns from one vLLM server through `/inference/v1/generate` (module doc).

    `root` is the server's address without `/v1` (e.g. `http://127.0.0.1:8000`); `model` the
    served name or adapter that requests name; `tokenizer` decodes the sampled ids into `text`.
    Transport (concurrency slots, retries, timeouts, `stats`) is `OpenAIEngine`'s.
    """

    def __init__(
        self, root: str, model: str, *, tokenizer: Any, max_concurrency: int = 64, seed: int = 0
    ) -> None:
        super().__init__(
            root, model, token_level=True, tokenizer=tokenizer, max_concurrency=max_concurrency,
            seed=seed,
        )  # fmt: skip
        self.adapter_version: int | None = None
        """The policy version of the adapter `model` names; None while requests name the base
        model (their tokens then take vLLM's weight labels)."""

    async def generate(self, request: GenerationRequest) -> Generation:
        """Sample one turn; a failed request returns `finish_reason="error"`, never raises."""
        start = time.perf_counter()
        try:
            gen = await self._sample(request)
            check_sampled(gen.token_ids, gen.logprobs, request, self.tokenizer)
            gen.text = self.tokenizer.decode(gen.token_ids)
        except RequestFailed as e:
            self.stats["errors"] += 1
            gen = Generation(text="", finish_reason="error", error=f"vLLM: {e}")
        gen.seconds = time.perf_counter() - start
        return gen

    async def _sample(self, request: GenerationRequest) -> Generation:
        """POST the request; an aborted one again with its tokens so far as prompt (module doc)."""
        if request.prompt_ids is None:
            raise RequestFailed("VLLMEngine needs GenerationRequest.prompt_ids (token level)")
        prompt, sampling = list(request.prompt_ids), request.sampling
        out = Generation(text="", prompt_tokens=len(prompt))
        for _ in range(MAX_RESUBMITS + 1):
            adapter = self.adapter_version  # the adapter named now samples this submission
            data = await self.post(GENERATE_PATH, generate_payload(prompt, sampling, self.model))
            part, reason = parse_generate(data)
            if adapter is not None:
                part.versions = [adapter] * len(part.token_ids)
            append(out, part)
            left = sampling.max_tokens - len(out.token_ids)
            if reason != "abort" or left <= 0:
                out.finish_reason = "length" if reason == "length" or left <= 0 else "stop"
                out.completion_tokens = len(out.token_ids)
                return out
            prompt, sampling = prompt + part.token_ids, _with_budget(sampling, left)
        raise RequestFailed(f"vLLM aborted the request {MAX_RESUBMITS + 1} times in a row")


def generate_payload(prompt: list[int], sampling: SamplingParams, model: str) -> dict[str, Any]:
    """The `/inference/v1/generate` body: prompt ids, vLLM sampling parameters, sampled logprobs."""
    params = {**OpenAIEngine.sampling_fields(sampling), "logprobs": 0}
    return {"token_ids": prompt, "model": model, "sampling_params": params}


def parse_generate(data: dict[str, Any]) -> tuple[Generation, str]:
    """The sampled ids, logprobs and versions of a `/inference/v1/generate` answer, and vLLM's
    finish reason (`stop`, `length`, `abort`)."""
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise RequestFailed(f"the answer has no choices: {str(data)[:300]}")
    choice = choices[0]
    ids = choice.get("token_ids") or []
    content = (choice.get("logprobs") or {}).get("content") or []
    logprobs = [float(c["logprob"]) for c in content if isinstance(c, dict) and "logprob" in c]
    if len(logprobs) != len(ids):
        raise RequestFailed(f"{len(logprobs)} logprobs for {len(ids)} sampled tokens")
    gen = Generation(text="", token_ids=list(ids), logprobs=logprobs)
    gen.versions = token_versions(choice.get("weight_versions"), len(ids))
    return gen, str(choice.get("finish_reason"))


def token_versions(spans: Any, n: int) -> list[int]:
    """One policy version per sampled token from vLLM's `weight_versions` spans; empty when a
    label is not an integer (weights no looprl sync labelled) or there are no spans."""
    if not spans:
        return []
    labels = [str(s.get("version")) for s in spans]
    if not all(label.isdigit() for label in labels):
        return []
    versions = [int(label) for s, label in zip(spans, labels, strict=True)
                for _ in range(int(s["end"]) - int(s["start"]))]  # fmt: skip
    if len(versions) != n:
        raise RequestFailed(f"weight_versions cover {len(versions)} of {n} sampled tokens")
    return versions


def append(out: Generation, part: Generation) -> None:
    """Add a (re)submission's tokens to the turn; versions stay known only if both parts know them."""
    known = bool(out.versions or not out.token_ids) and bool(part.versions or not part.token_ids)
    out.versions = out.versions + part.versions if known else []
    out.token_ids = out.token_ids + part.token_ids
    out.logprobs = out.logprobs + part.logprobs


def _with_budget(sampling: SamplingParams, max_tokens: int) -> SamplingParams:
    """`sampling` with `max_tokens` left (the rest of an aborted request's budget)."""
    return replace(sampling, max_tokens=max_tokens)
