"""Tokens per second: TorchEngine against Hugging Face `model.generate` on the same model and batch.

Scenario `fixed` (the default, like for like): both sample at temperature 1 with no truncation and
generate exactly `--new-tokens` tokens for every sequence (the engine gets no stop tokens,
`generate` gets `min_new_tokens`) from the same random prompts of `--prompt-len` tokens.

Scenario `rl` (what a GRPO step asks for): prompts come in groups of 8 identical copies and each
answer has its own length, drawn uniformly from [new_tokens/8, new_tokens] (as if eos came at
different points). `generate` must run each batch to its longest answer; only the tokens each
answer needs are counted, for both sides.

Runs alternate between the two sides (and which goes first) so that load from other processes hits
both alike. Each cell is the median tokens/s with [min-max]; the ratio is the median over runs of
engine/generate measured back to back. Prefill time is included (it is part of every rollout).

    python -m benchmarks.engine                 # tiny + SmolLM2-135M-shaped random model
    python -m benchmarks.engine --quick         # a smoke test in seconds
    python -m benchmarks.engine --models smollm2-135m --batch-sizes 32,64 --scenario rl
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from benchmarks.roofline import matmul_gflops, model_flops_per_token, roofline_line
from looprl.engines.torch_engine import TorchEngine
from looprl.types import SamplingParams

GROUP = 8  # answers per prompt in the `rl` scenario


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
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(cfg).eval(), IdTokenizer()


def load_named(name: str) -> tuple[Any, Any]:
    """(model, tokenizer) for a benchmark model name: `smollm2-shape[-small]` or a load_model name."""
    if name == "smollm2-shape":
        return smollm2_shaped()
    if name == "smollm2-shape-small":
        return smollm2_shaped(layers=4)
    from looprl.models.loading import load_model

    model, tokenizer = load_model(name, device="cpu")
    return model.eval(), tokenizer


@dataclass
class Workload:
    """Prompts (batch, prompt_len) and the number of new tokens each answer needs."""

    prompts: torch.Tensor
    lengths: list[int]

    @property
    def useful_tokens(self) -> int:
        """Tokens both sides are credited with."""
        return sum(self.lengths)


def make_workload(
    scenario: str, vocab: int, batch: int, prompt_len: int, new_tokens: int
) -> Workload:
    """Seeded prompts and answer lengths for one scenario and batch size."""
    g = torch.Generator().manual_seed(batch)
    if scenario == "fixed":
        prompts = torch.randint(3, vocab, (batch, prompt_len), generator=g)
        return Workload(prompts, [new_tokens] * batch)
    groups = max(1, batch // GROUP)
    unique = torch.randint(3, vocab, (groups, prompt_len), generator=g)
    prompts = unique.repeat_interleave(GROUP, dim=0)[:batch]
    if len(prompts) < batch:
        prompts = torch.cat([prompts, unique[:1].expand(batch - len(prompts), -1)])
    rng = random.Random(batch)
    return Workload(
        prompts, [rng.randint(max(1, new_tokens // 8), new_tokens) for _ in range(batch)]
    )


def run_hf(model: Any, work: Workload) -> int:
    """`model.generate` to the longest answer in the batch; return the credited tokens."""
    eos = model.generation_config.eos_token_id
    longest = max(work.lengths)
    with torch.inference_mode():
        out = model.generate(
            work.prompts,
            attention_mask=torch.ones_like(work.prompts),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=longest,
            min_new_tokens=longest,
            eos_token_id=eos,
            pad_token_id=eos[0] if isinstance(eos, list) else (eos if eos is not None else 0),
        )
    if out.shape[1] - work.prompts.shape[1] != longest:
        raise RuntimeError("generate stopped early; min_new_tokens was not honoured")
    return work.useful_tokens


def run_engine(engine: TorchEngine, work: Workload) -> int:
    """The engine with one max_tokens per request; return the credited tokens."""
    params = [SamplingParams(max_tokens=n) for n in work.lengths]
    gens = engine.generate_many(work.prompts.tolist(), params)
    bad = [g.error for g in gens if g.finish_reason == "error"]
    if bad:
        raise RuntimeError(f"engine failed: {bad[0]}")
    if [len(g.token_ids) for g in gens] != work.lengths:
        raise RuntimeError("the engine returned a different number of tokens than asked")
    return work.useful_tokens


def timed(fn: Callable[[], int], clock: Callable[[], float]) -> float:
    """Tokens per second of one call, by `clock` (wall time, or this process's CPU time)."""
    start = clock()
    tokens = fn()
    return tokens / (clock() - start)


@dataclass
class Row:
    """One table row: tokens/s samples of each side, measured in pairs."""

    model: str
    batch: int
    hf: list[float] = field(default_factory=list)
    engine: list[float] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        """Median over runs of engine/generate tokens per second."""
        return statistics.median(e / h for e, h in zip(self.engine, self.hf, strict=True))


def bench_engine(model: Any, tokenizer: Any, work: Workload, **options: Any) -> TorchEngine:
    """A TorchEngine sized to `work`, with no prefix cache: repeated runs of the same prompts would
    otherwise skip their prefill. `options` go to TorchEngine (fuse_projections, threads)."""
    return TorchEngine(
        model, tokenizer, max_batch_size=len(work.lengths), stop_token_ids=[], device="cpu",
        prefix_cache_mb=0, **options,
    )  # fmt: skip


def bench_row(
    name: str, model: Any, tokenizer: Any, work: Workload, runs: int, clock: Callable[[], float]
) -> Row:
    """Alternate the two sides `runs` times on one workload."""
    engine = bench_engine(model, tokenizer, work)
    warm = Workload(work.prompts, [2] * len(work.lengths))
    row = Row(name, len(work.lengths))
    try:
        run_hf(model, warm)
        run_engine(engine, warm)
        for r in range(runs):
            sides = [
                ("hf", lambda: run_hf(model, work)),
                ("engine", lambda: run_engine(engine, work)),
            ]
            for side, fn in sides[:: 1 if r % 2 == 0 else -1]:
                getattr(row, side).append(timed(fn, clock))
    finally:
        engine.shutdown()
    return row


def _cell(samples: list[float]) -> str:
    return f"{statistics.median(samples):8.1f} [{min(samples):.1f}-{max(samples):.1f}]"


def format_row(row: Row) -> str:
    """One aligned text line."""
    return f"{row.model:<20} {row.batch:>5}  {_cell(row.hf):<28} {_cell(row.engine):<28} {row.ratio:5.2f}x"


def main(argv: list[str] | None = None) -> list[Row]:
    """Parse flags, run, print the table; return its rows."""
    p = argparse.ArgumentParser(description="TorchEngine vs HF generate, tokens per second")
    p.add_argument(
        "--models",
        default="tiny,smollm2-shape",
        help="comma list: tiny, smollm2-shape, smollm2-135m, a path",
    )
    p.add_argument("--batch-sizes", default="1,8,32,64")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--scenario", choices=["fixed", "rl"], default="fixed")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument(
        "--clock", choices=["wall", "cpu"], default="wall", help="wall time or process CPU time"
    )
    p.add_argument("--quick", action="store_true", help="tiny budget: a smoke test in seconds")
    args = p.parse_args(argv)
    if args.quick:
        args.models, args.batch_sizes = "smollm2-shape-small", "1,8"
        args.prompt_len, args.new_tokens, args.runs = 16, 8, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    print(
        f"scenario {args.scenario}; torch {torch.__version__}, {torch.get_num_threads()} threads; "
        f"prompt {args.prompt_len}, {args.new_tokens} new tokens; {args.runs} runs; "
        f"tokens/s by {args.clock} clock, median [min-max]"
    )
    print(f"{'model':<20} {'batch':>5}  {'HF generate':<28} {'TorchEngine':<28} ratio")
    rows: list[Row] = []
    roof = matmul_gflops()[0]
    roofs = []
    for name in args.models.split(","):
        model, tokenizer = load_named(name.strip())
        vocab = model.get_input_embeddings().weight.shape[0]
        flops = model_flops_per_token(model)
        for batch in [int(b) for b in args.batch_sizes.split(",")]:
            work = make_workload(args.scenario, vocab, batch, args.prompt_len, args.new_tokens)
            rows.append(bench_row(name.strip(), model, tokenizer, work, args.runs, clock))
            print(format_row(rows[-1]), flush=True)
            # generated tokens only: prefill work is left out, so this understates the engine a little
            tok_s = statistics.median(rows[-1].engine)
            roofs.append(roofline_line(f"{name.strip()} batch {batch} engine", flops, tok_s, roof))
    for line in roofs:
        print(line)
    return rows


if __name__ == "__main__":
    main()
