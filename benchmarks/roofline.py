"""The machine's measured matmul throughput, the roof that training and generation are held to.

`matmul_gflops()` times square float32 matmuls with torch on this CPU (the same dtype and thread
count the benchmarks use) and returns the median GFLOP/s; `model_flops_per_token()` gives the
usual 2·N (forward) estimate from a model's parameter count, so a benchmark can print which
fraction of the roof it reached: achieved = flops_per_token x tokens/s (x3 for forward+backward).

    python -m benchmarks.roofline            # prints GFLOP/s for a few sizes
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def matmul_gflops(
    size: int = 1024, repeats: int = 7, dtype: torch.dtype = torch.float32
) -> tuple[float, float, float]:
    """(median, min, max) GFLOP/s of a size x size @ size x size matmul in `dtype`."""
    a = torch.randn(size, size, dtype=dtype)
    b = torch.randn(size, size, dtype=dtype)
    for _ in range(2):
        a @ b  # warm-up: thread pool, caches
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        rates.append(2 * size**3 / (time.perf_counter() - t0) / 1e9)
    return statistics.median(rates), min(rates), max(rates)


def model_flops_per_token(model: torch.nn.Module) -> float:
    """Forward FLOPs per token, 2 x (parameters outside the input embedding).

    Attention's quadratic term is left out (short sequences here), so the fraction it yields is
    a slight under-estimate of the real work done.
    """
    params = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    tied = emb is not None and getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    if emb is not None and not tied:
        params -= sum(p.numel() for p in emb.parameters())
    return 2.0 * params


def roofline_line(label: str, flops_per_token: float, tokens_per_s: float, roof: float) -> str:
    """One printable line: achieved GFLOP/s and the fraction of the measured roof."""
    achieved = flops_per_token * tokens_per_s / 1e9
    return (
        f"roofline {label}: {achieved:.1f} GFLOP/s of {roof:.0f} measured ({achieved / roof:.0%})"
    )


def main() -> None:
    """Print the matmul roof for a few sizes."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024, 2048])
    args = p.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32")
    for size in args.sizes:
        med, lo, hi = matmul_gflops(size)
        print(f"matmul {size}x{size}: {med:.1f} GFLOP/s (min {lo:.1f}, max {hi:.1f})")


if __name__ == "__main__":
    main()
