"""The model a bootstrap trains (`ModelStudent`) and the server that may sample its first round."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from looprl.engines.config import EngineSection
from looprl.engines.factory import make_policy
from looprl.rendering.formats import ParserName
from looprl.rendering.renderer import Renderer
from looprl.rendering.templates import set_chat_template
from looprl.sft.bootstrap import Sampler
from looprl.sft.config import BootstrapSection
from looprl.sft.train import sft_model


@dataclass
class ModelStudent:
    """A local model, sampled through the engine factory (`engine.kind`: torch in process, or
    vLLM servers started on the round's model) and fine-tuned with `looprl.sft.train.sft_model`.

    `concurrency` is the number of task groups sampled at once; `log` is `sft_train`'s.
    """

    section: BootstrapSection
    engine: EngineSection
    parser: ParserName = "auto"
    chat_template: str | None = None
    keep_reasoning: bool = True
    seed: int = 0
    max_model_len: int = 2048
    concurrency: int = 64
    log: Callable[[int, int, float, float], None] | None = None

    def sampler(self, model: str) -> Sampler:
        """A sampler on `model`: the factory's engine and a renderer with the model's template."""
        policy = make_policy(
            model, seed=self.seed, engine=self.engine, max_model_len=self.max_model_len,
            max_concurrency=self.concurrency * self.section.attempts,
        )  # fmt: skip
        set_chat_template(policy.tokenizer, self.chat_template)
        renderer = Renderer(
            policy.tokenizer, parser=self.parser, keep_reasoning=self.keep_reasoning
        )
        return Sampler(policy.engine, renderer, model)

    def finetune(self, base: str, rows: list[dict[str, Any]], output: Path) -> int:
        """Fine-tune `base` on `rows`; save it to `output`; the optimizer steps."""
        s = self.section
        return sft_model(
            base, rows, output, epochs=s.sft_epochs, lr=s.sft_lr,
            batch_size=s.sft_batch_size, seed=self.seed, log=self.log,
            chat_template=self.chat_template,
        )  # fmt: skip


def teacher_sampler(section: BootstrapSection, concurrency: int) -> Sampler:
    """A message-level sampler on the `[bootstrap]` teacher server (`teacher_base_url`)."""
    if section.teacher_base_url is None or section.teacher_model is None:
        raise ValueError("no teacher: set bootstrap.teacher_base_url and bootstrap.teacher_model")
    var = section.teacher_api_key_var
    policy = make_policy(
        section.teacher_model, base_url=section.teacher_base_url,
        api_key=os.environ.get(var) if var else None,
        max_concurrency=concurrency * section.attempts,
    )  # fmt: skip
    return Sampler(policy.engine, None, f"{section.teacher_model} at {section.teacher_base_url}")
