"""TorchEngine decode A/B: fused vs unfused projections, MKL-packed weights or not, and 1 vs 2
decode threads, interleaved.

Each round runs every variant once on the same workload (benchmarks.engine's `fixed` scenario:
random prompts, every sequence generates exactly `--new-tokens` tokens at temperature 1), in an
order that rotates by round, so load from other processes hits all variants alike. Prints the
median tokens/s [min-max] of each variant, the median per-round ratio to the first variant, and
the load average at the start and end.

    python -m benchmarks.decode_ab --models tiny,smollm2-shape --batch-sizes 1,8,64
    python -m benchmarks.decode_ab --variants unfused-1,unfused-2   # threads only
    python -m benchmarks.decode_ab --variants unfused-1,packed-1    # packed weights (the default)

Kinds: `unfused` (7 matmuls a layer over the model's weights), `fused` (q/k/v and gate/up fused),
`packed` (the engine's default: every matmul over MKL-packed copies), `fused+packed`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.engine import Workload, bench_engine, load_named, make_workload, run_engine


@dataclass(frozen=True)
class Variant:
    """One engine setting: fused projections or not, MKL-packed weights or not, and the torch
    threads it decodes on."""

    name: str
    fuse: bool
    threads: int
    pack: bool = False


KINDS = {  # variant kind -> (fuse_projections, pack_weights)
    "unfused": (False, False),
    "fused": (True, False),
    "packed": (False, True),  # TorchEngine's default
    "fused+packed": (True, True),
}


def parse_variants(text: str) -> list[Variant]:
    """`fused-1,unfused-1,packed-1` -> variants; the number is the engine's `threads`."""
    out = []
    for item in text.split(","):
        kind, _, threads = item.strip().rpartition("-")
        if kind not in KINDS or not threads.isdigit():
            raise SystemExit(
                f"bad variant {item!r}; write KIND-N with KIND one of {', '.join(KINDS)} "
                "and N the threads"
            )
        fuse, pack = KINDS[kind]
        out.append(Variant(item.strip(), fuse, int(threads), pack))
    return out


def load() -> str:
    """The 1-minute load average, for printing beside a number."""
    return f"{os.getloadavg()[0]:.2f}"


def bench(
    model: Any, tokenizer: Any, work: Workload, variants: list[Variant], rounds: int
) -> dict[str, list[float]]:
    """Tokens/s samples per variant, `rounds` interleaved rounds after one warm-up each."""
    engines = {
        v.name: bench_engine(
            model, tokenizer, work, fuse_projections=v.fuse, pack_weights=v.pack, threads=v.threads
        )
        for v in variants
    }
    samples: dict[str, list[float]] = {v.name: [] for v in variants}
    try:
        for r in range(rounds + 1):
            shift = r % len(variants)
            for v in variants[shift:] + variants[:shift]:
                start = time.perf_counter()
                tokens = run_engine(engines[v.name], work)
                if r:  # round 0 warms up
                    samples[v.name].append(tokens / (time.perf_counter() - start))
    finally:
        for engine in engines.values():
            engine.shutdown()
    return samples


def main(argv: list[str] | None = None) -> None:
    """Parse flags, run each model and batch size, print one line per variant."""
    p = argparse.ArgumentParser(description="TorchEngine decode A/B (fusion, threads)")
    p.add_argument("--models", default="tiny,smollm2-shape")
    p.add_argument("--batch-sizes", default="1,8,64")
    p.add_argument("--variants", default="unfused-1,fused-1,unfused-2")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    variants = parse_variants(args.variants)
    print(
        f"torch {torch.__version__}; load {load()}; {args.rounds} rounds; tokens/s median [min-max]"
    )
    for name in args.models.split(","):
        model, tokenizer = load_named(name.strip())
        vocab = model.get_input_embeddings().weight.shape[0]
        for batch in [int(b) for b in args.batch_sizes.split(",")]:
            work = make_workload("fixed", vocab, batch, args.prompt_len, args.new_tokens)
            s = bench(model, tokenizer, work, variants, args.rounds)
            base = s[variants[0].name]
            for v in variants:
                ratio = statistics.median(a / b for a, b in zip(s[v.name], base, strict=True))
                cell = f"{statistics.median(s[v.name]):8.1f} [{min(s[v.name]):.1f}-{max(s[v.name]):.1f}]"
                print(
                    f"{name:<14} batch {batch:>3} {v.name:<10} {cell:<26} {ratio:5.2f}x  load {load()}"
                )


if __name__ == "__main__":
    main()
