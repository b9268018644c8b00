"""Quiet loading: transformers' progress bars and one misleading tokenizer warning, turned off at source.

looprl shows its own progress (Rich bars, one line per step), so the tqdm bars transformers and
huggingface_hub draw while loading, converting and saving weights ("Loading weights", "Writing
model shards", "Fetching N files", "Converting and de-quantizing GGUF tensors") only interleave
with it. Besides the bars, two messages that tell a looprl user nothing are silenced, each by
its exact text: the tokenizer's "sequence length is longer" warning and a deprecation transformers
aims at peft. transformers' logging level is left as it is, so its real warnings still show.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator
from typing import Any

# The key under which a transformers tokenizer remembers having given the warning
# "Token indices sequence length is longer than the specified maximum sequence length".
SEQUENCE_LENGTH_WARNING = "sequence-length-is-longer-than-the-specified-maximum"


def disable_progress_bars() -> None:
    """Turn off the tqdm bars of transformers and huggingface_hub for this process.

    Process-wide, as transformers' own switch is; `transformers.utils.logging.enable_progress_bar()`
    turns them back on for a program that wants them.
    """
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # also huggingface_hub's bars


def silence_sequence_length_warning(tokenizer: Any) -> None:
    """Mark the tokenizer's "sequence length is longer than the maximum" warning as already given.

    The renderer encodes whole conversations to check the token-exact prefix property, and those
    encodings may pass `model_max_length` before the rollout finds the context full and ends the
    episode; no such sequence reaches the model, so the warning (and its "will result in indexing
    errors") is misleading. The context limit is the environment's `max_context_tokens`.
    """
    flags = getattr(tokenizer, "deprecation_warnings", None)
    if isinstance(flags, dict):
        flags[SEQUENCE_LENGTH_WARNING] = True


def silence_peft_deprecation() -> None:
    """Ignore transformers' FutureWarning that `is_gradient_checkpointing` is deprecated.

    peft reads that property when it wraps a model for LoRA; the warning is addressed to peft's
    authors and is the same on every LoRA run. Only this message from transformers is filtered.
    """
    warnings.filterwarnings(
        "ignore",
        message=r"`is_gradient_checkpointing` is deprecated",
        category=FutureWarning,
        module=r"transformers\.",
    )


@contextlib.contextmanager
def quiet_gguf_conversion() -> Iterator[None]:
    """Within the block, transformers' GGUF reader draws no tqdm bar (it calls tqdm directly).

    The reader imports `tqdm` into its own module, past transformers' progress-bar switch, so the
    name is replaced there for the block by the same tqdm with `disable=True`, and restored after.
    """
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    original = getattr(gguf_utils, "tqdm", None)
    if original is None:  # a transformers version that no longer draws its own bar here
        yield
        return
    gguf_utils.tqdm = functools.partial(original, disable=True)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        gguf_utils.tqdm = original  # type: ignore[attr-defined]
