"""The in-process engine's caches are freed before an update that nothing generates beside, and
what is sampled and trained afterwards is unchanged (looprl/engines/placement.py's module doc)."""

from __future__ import annotations

import asyncio

import pytest
from helpers import read_metrics, small_config, stable

from looprl.engines.base import GenerationRequest
from looprl.engines.config import EngineSection
from looprl.engines.placement import InProcessPlacement, make_placement
from looprl.models.loading import load_model
from looprl.trainer.trainer import Trainer
from looprl.types import Generation, SamplingParams

PROMPT = [1, 5, 9, 14, 3, 7, 2]


def sample(placement: InProcessPlacement, prompt: list[int]) -> Generation:
    """Six tokens at temperature 1 with a fixed seed from the placement's engine."""
    request = GenerationRequest(
        prompt_ids=prompt, sampling=SamplingParams(max_tokens=6, temperature=1.0, seed=3)
    )
    return asyncio.run(placement.engine.generate(request))


@pytest.mark.parametrize("generate_ahead", [False, True])  # shared, copy
def test_release_frees_the_engines_caches_and_keeps_what_it_samples(generate_ahead) -> None:
    net, tok = load_model("tiny")
    placement = make_placement(net, tok, EngineSection(), generate_ahead=generate_ahead)
    assert isinstance(placement, InProcessPlacement)
    engine = placement.torch_engine
    try:
        first = sample(placement, PROMPT)
        assert engine.backend.allocated_bytes > 0  # type: ignore[attr-defined]  # the slots it grew
        placement.release_idle_memory()
        assert engine.backend.allocated_bytes == 0  # type: ignore[attr-defined]
        hits = engine.stats.prefix_hits
        again = sample(placement, PROMPT)  # kept, this would reuse the first turn's keys/values
        assert engine.stats.prefix_hits == hits  # the prefix cache was emptied too
        assert (again.token_ids, again.logprobs) == (first.token_ids, first.logprobs)
    finally:
        asyncio.run(engine.close())


@pytest.mark.slow
def test_a_run_that_frees_the_caches_trains_exactly_like_one_that_keeps_them(
    tmp_path, monkeypatch
) -> None:
    seen: list[int] = []
    update = Trainer._update

    def watched(self, groups):
        # the engine's KV slots as the update starts
        seen.append(self.engine.backend.allocated_bytes)
        return update(self, groups)

    monkeypatch.setattr(Trainer, "_update", watched)
    overrides = {"trainer.steps": 3, "trainer.save_every": 3}
    Trainer(small_config(tmp_path, "freed", **overrides)).run()
    assert seen == [0, 0, 0]
    monkeypatch.setattr(InProcessPlacement, "release_idle_memory", lambda self: None)
    Trainer(small_config(tmp_path, "kept", **overrides)).run()
    assert seen[3:] and min(seen[3:]) > 0  # the caches stayed through the updates
    freed, kept = read_metrics(tmp_path / "freed"), read_metrics(tmp_path / "kept")
    assert any(r["train/grad_norm"] > 0 for r in freed)  # real updates: equality means something
    assert [stable(r) for r in freed] == [stable(r) for r in kept]
