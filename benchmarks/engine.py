"""Tokens per second: TorchEngine against Hugging Face `model.generate` on the same model and batch.

Both sample at temperature 1 with no truncation and generate exactly `--new-tokens` tokens per
sequence (eos is ignored: the engine gets no stop tokens, `generate` gets `min_new_tokens`), from
the same random prompts of `--prompt-len` tokens. Runs alternate between the two so that load from
other processes hits both alike; the table shows the median tokens/s with [min, max] and the ratio
of medians. Prefill time is included (it is part of every rollout).

    python -m benchmarks.engine                 # tiny + SmolLM2-135M-shaped random model
    python -m benchmarks.engine --quick         # seconds: smoke test
    python -m benchmarks.engine --models smollm2-135m --batch-sizes 32,64
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from looprl.engines.torch_engine import TorchEngine
from looprl.types import SamplingParams


class IdTokenizer:
    """Stand-in tokenizer for random-weight models: decodes ids as numbers."""

    eos_token_id = None

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """Space-separated ids."""
        return " ".join(map(str, ids))


def smollm2_shaped(layers: int = 30) -> tuple[Any, Any]:
    """A randomly initialised LlamaForCausalLM with SmolLM2-135M's shape (float32)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(cfg).eval(), IdTokenizer()


def load_named(name: str) -> tuple[Any, Any]:
    """(model, tokenizer) for a benchmark model name."""
    if name == "smollm2-shape":
        return smollm2_shaped()
    if name == "smollm2-shape-small":
        return smollm2_shaped(layers=4)
    from looprl.models.loading import load_model

    model, tokenizer = load_model(name, device="cpu")
    return model.eval(), tokenizer


@dataclass
class Row:
    """One table row: tokens/s samples of each side."""

    model: str
    batch: int
    hf: list[float]
    engine: list[float]

    @property
    def ratio(self) -> float:
        """Median engine tokens/s over median generate tokens/s."""
        return statistics.median(self.engine) / statistics.median(self.hf)


def _hf_generate(model: Any, prompts: torch.Tensor, new_tokens: int) -> int:
    """Sample with `model.generate`; return the number of new tokens produced."""
    eos = model.generation_config.eos_token_id
    with torch.inference_mode():
        out = model.generate(
            prompts,
            attention_mask=torch.ones_like(prompts),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            eos_token_id=eos,
            pad_token_id=eos[0] if isinstance(eos, list) else (eos if eos is not None else 0),
        )
    return int(out[:, prompts.shape[1] :].numel())


def _engine_generate(engine: TorchEngine, prompts: torch.Tensor, new_tokens: int) -> int:
    """Sample with the engine; return the number of new tokens produced."""
    gens = engine.generate_many(prompts.tolist(), SamplingParams(max_tokens=new_tokens))
    bad = [g.error for g in gens if g.finish_reason == "error"]
    if bad:
        raise RuntimeError(f"engine failed: {bad[0]}")
    return sum(len(g.token_ids) for g in gens)


def _timed(fn: Callable[[], int], clock: Callable[[], float]) -> float:
    """Tokens per second of one call, by `clock` (wall time, or this process's CPU time)."""
    start = clock()
    tokens = fn()
    return tokens / (clock() - start)


def bench_model(
    name: str, batch_sizes: list[int], prompt_len: int, new_tokens: int, runs: int, clock: Callable[[], float]
) -> list[Row]:
    """Benchmark one model at each batch size."""
    model, tokenizer = load_named(name)
    vocab = model.get_input_embeddings().weight.shape[0]
    rows = []
    for batch in batch_sizes:
        g = torch.Generator().manual_seed(batch)
        prompts = torch.randint(3, vocab, (batch, prompt_len), generator=g)
        engine = TorchEngine(model, tokenizer, max_batch_size=batch, stop_token_ids=[], device="cpu")
        try:
            _hf_generate(model, prompts, 2)  # warm-up
            _engine_generate(engine, prompts, 2)
            row = Row(name, batch, [], [])
            for _ in range(runs):
                row.hf.append(_timed(lambda: _hf_generate(model, prompts, new_tokens), clock))  # noqa: B023
                row.engine.append(_timed(lambda: _engine_generate(engine, prompts, new_tokens), clock))  # noqa: B023
        finally:
            engine.shutdown()
        print(format_row(row), flush=True)
        rows.append(row)
    return rows


def _cell(samples: list[float]) -> str:
    return f"{statistics.median(samples):8.1f} [{min(samples):.1f}-{max(samples):.1f}]"


def format_row(row: Row) -> str:
    """One aligned text line."""
    return f"{row.model:<20} {row.batch:>5}  {_cell(row.hf):<28} {_cell(row.engine):<28} {row.ratio:5.2f}x"


def main(argv: list[str] | None = None) -> list[Row]:
    """Parse flags, run, print the table; return its rows."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny,smollm2-shape", help="comma list: tiny, smollm2-shape, smollm2-135m, a path")
    p.add_argument("--batch-sizes", default="1,8,32,64")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="wall time, or process CPU time (steadier when other jobs share the cores)",
    )
    p.add_argument("--quick", action="store_true", help="tiny budget: a smoke test in seconds")
    args = p.parse_args(argv)
    if args.quick:
        args.models, args.batch_sizes = "smollm2-shape-small", "1,8"
        args.prompt_len, args.new_tokens, args.runs = 16, 8, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; prompt {args.prompt_len}, "
          f"{args.new_tokens} new tokens, {args.runs} runs; tokens/s by {args.clock} clock, median [min-max]")
    print(f"{'model':<20} {'batch':>5}  {'HF generate':<28} {'TorchEngine':<28} ratio")
    rows: list[Row] = []
    for name in args.models.split(","):
        sizes = [int(b) for b in args.batch_sizes.split(",")]
        clock = time.perf_counter if args.clock == "wall" else time.process_time
        rows += bench_model(name.strip(), sizes, args.prompt_len, args.new_tokens, args.runs, clock)
    return rows


if __name__ == "__main__":
    main()
