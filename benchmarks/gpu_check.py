"""One command that measures looprl on one CUDA GPU: a bf16 GRPO train step and the engine, with MFU.

On randomly initialised models of SmolLM2-135M's and Qwen3-0.6B's shapes (configs built here,
nothing downloaded, token ids drawn directly: no tokenizer), for each model:

1. decode: the same random prompts (`--batch` of `--prompt-len` ids) through `TorchEngine` and
   through Hugging Face `model.generate`, each sampling exactly `--new-tokens` tokens per
   sequence, on a bf16 copy of the weights (the `fixed` workload of `benchmarks.engine`);
2. train: one GRPO update (`looprl.trainer.update.train_on_batch`, the trainer's own step) on
   those prompts and the engine's answers, in groups of `--group` with half of each group
   rewarded, so every sample carries gradient; float32 master weights with bf16 compute
   (`model.dtype = "bfloat16"`), AdamW and the trainer's default settings.

and prints one table (model, phase, tokens/s, TFLOP/s, MFU) against the bf16 matmul roof it
measures first in the same run (`--matmul-size`^3, 3 warm-ups then 10 timed products).

FLOPs, with N = parameters outside the input embedding (the tied output matrix counted once, as
`benchmarks.roofline.model_flops_per_token` does): decode 2·N per generated token; train 6·N per
forwarded position (forward 2·N, backward 4·N; positions = prompt + answer of every sample).
Attention's quadratic term is left out, so TFLOP/s and MFU are slight under-estimates. MFU is of
the measured matmul roof, not of the datasheet's peak. Prefill is timed with decode and credited
nothing. The engine decodes from a bf16 copy: a looprl run with one process and the shared
placement samples from the float32 master weights instead.

Time: `--budget` seconds (default 360) bound the repetitions (`--runs` of each decode, `--steps`
train steps after one warm-up): each cell gets an equal share of what is left and always at
least one run; a model whose turn comes after the budget is spent is skipped with a line. On
an H200 the defaults are sized to finish well inside 8 minutes.

On the device machine, with torch, transformers, tokenizers, safetensors, numpy, rich, httpx
and peft already installed there, and looprl's other dependencies carried as wheels in `.whl/`
(made here, with network, by `make gpu-wheels`: see `benchmarks/gpu_wheels.sh`), from the
repository root:

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site python3 -m benchmarks.gpu_check --out gpu_check.json

Without a CUDA device it prints one line and exits 2. `--device cpu --tiny` runs the same code
on tiny float32 models in seconds (what the tests run):

    python -m benchmarks.gpu_check --device cpu --tiny --out /tmp/gpu_check.json
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from benchmarks.engine import IdTokenizer, Workload, make_workload, run_engine, run_hf, timed
from benchmarks.roofline import model_flops_per_token
from looprl.algorithms.objective import group_advantages
from looprl.engines.torch_engine import TorchEngine
from looprl.files import write_text_atomically
from looprl.trainer.batch import Sample
from looprl.trainer.config import load_config
from looprl.trainer.distributed import for_scoring
from looprl.trainer.precision import compute_dtype
from looprl.trainer.setup import make_optimizer, make_scheduler
from looprl.trainer.update import UpdateContext, train_on_batch
from looprl.types import Generation, SamplingParams

NO_CUDA = "no CUDA device: gpu_check measures a GPU; run it on a machine with one"
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
# FLOPs per token as a multiple of the forward's 2·N: decode is a forward, training a forward
# and a backward (activations' and weights' gradients, 2·N each)
FLOP_FACTOR = {"decode TorchEngine": 1, "decode HF generate": 1, "train GRPO step": 3}


@dataclass(frozen=True)
class Shape:
    """A decoder-only transformer's shape, enough to build its Hugging Face config."""

    family: str  # "llama" (LlamaForCausalLM) or "qwen3" (Qwen3ForCausalLM: q/k norms)
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    rope_theta: float
    tied: bool = True  # the output matrix is the input embedding


# the published configs of HuggingFaceTB/SmolLM2-135M and Qwen/Qwen3-0.6B
SHAPES = {
    "smollm2-135m": Shape("llama", 576, 30, 9, 3, 64, 1536, 49152, 100_000.0),
    "qwen3-0.6b": Shape("qwen3", 1024, 28, 16, 8, 128, 3072, 151936, 1_000_000.0),
}


def tiny_shape(shape: Shape) -> Shape:
    """The same family at a size a CPU runs in milliseconds (for `--tiny`)."""
    return replace(shape, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16,
                   intermediate=128, vocab=512)  # fmt: skip


@dataclass(frozen=True)
class Plan:
    """The workload of one run: batch, lengths, repetitions, the matmul roof's size."""

    batch: int = 64  # sequences decoded together and trained on in one step
    group: int = 8  # GRPO group size (rollouts per prompt)
    prompt_len: int = 128
    new_tokens: int = 256
    runs: int = 3  # timed runs of each decode side
    steps: int = 3  # timed train steps (after one warm-up step)
    matmul_size: int = 8192
    matmul_repeats: int = 10


TINY_PLAN = Plan(batch=8, group=4, prompt_len=8, new_tokens=8, runs=1, steps=1,
                 matmul_size=256, matmul_repeats=3)  # fmt: skip


def build_model(shape: Shape, device: torch.device) -> Any:
    """A randomly initialised (seed 0) float32 causal LM of `shape`, created on `device`."""
    rope = {"rope_type": "default", "rope_theta": shape.rope_theta}
    common: dict[str, Any] = dict(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim,
        max_position_embeddings=8192, rope_parameters=rope, tie_word_embeddings=shape.tied,
    )  # fmt: skip
    if shape.family == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        config: Any = LlamaConfig(**common)
        cls: Any = LlamaForCausalLM
    else:
        from transformers import Qwen3Config, Qwen3ForCausalLM

        config, cls = Qwen3Config(**common, rms_norm_eps=1e-6), Qwen3ForCausalLM
    torch.manual_seed(0)
    with torch.device(device):
        return cls(config).eval()


def synced_clock(device: torch.device) -> Callable[[], float]:
    """A wall clock that first waits for the device's queued work (CUDA runs asynchronously)."""

    def clock() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    return clock


def matmul_tflops(size: int, repeats: int, dtype: torch.dtype, device: torch.device) -> float:
    """TFLOP/s of `repeats` size^3 matmuls in `dtype` timed together, after 3 warm-ups."""
    a = torch.randn(size, size, dtype=dtype, device=device)
    b = torch.randn(size, size, dtype=dtype, device=device)
    clock = synced_clock(device)
    for _ in range(3):
        a @ b  # warm-up: library handles, kernel choice, clocks
    start = clock()
    for _ in range(repeats):
        a @ b
    return 2 * size**3 * repeats / (clock() - start) / 1e12


@dataclass
class Row:
    """One cell of the table: a model's phase, its tokens/s samples and forward FLOPs per token."""

    model: str
    phase: str  # a key of FLOP_FACTOR
    tokens_per_s: list[float]
    forward_flops_per_token: float  # 2·N

    @property
    def median(self) -> float:
        """Median tokens/s over the runs."""
        return statistics.median(self.tokens_per_s)

    @property
    def tflops(self) -> float:
        """Achieved TFLOP/s: FLOPs per token (FLOP_FACTOR x 2·N) x median tokens/s."""
        return FLOP_FACTOR[self.phase] * self.forward_flops_per_token * self.median / 1e12


def format_table(rows: list[Row], peak_tflops: float) -> str:
    """The aligned text table: model, phase, tokens/s, TFLOP/s, MFU of the measured peak."""
    lines = [f"{'model':<20} {'phase':<20} {'tokens/s':>12} {'TFLOP/s':>9} {'MFU':>7}"]
    for r in rows:
        lines.append(
            f"{r.model:<20} {r.phase:<20} {r.median:>12,.0f} {r.tflops:>9.3g} "
            f"{r.tflops / peak_tflops:>7.1%}"
        )
    return "\n".join(lines)


class Budget:
    """Seconds left for the repetitions, shared equally among the cells still to run."""

    def __init__(self, seconds: float, cells: int) -> None:
        self.end = time.monotonic() + seconds
        self.cells = cells

    def next_cell(self) -> float:
        """The deadline (monotonic time) of the next cell: an equal share of what is left."""
        now = time.monotonic()
        share = max(0.0, self.end - now) / max(1, self.cells)
        self.cells -= 1
        return now + share

    def spent(self) -> bool:
        """Whether no time is left."""
        return time.monotonic() >= self.end


def repeat(
    fn: Callable[[], int], clock: Callable[[], float], runs: int, until: float
) -> list[float]:
    """Tokens/s of up to `runs` calls of `fn` (which returns its token count); at least one,
    no new one after monotonic time `until`."""
    rates = [timed(fn, clock)]
    while len(rates) < runs and time.monotonic() < until:
        rates.append(timed(fn, clock))
    return rates


def bench_decode(
    name: str, model: Any, plan: Plan, device: torch.device, budget: Budget
) -> tuple[list[Row], list[list[int]], list[Generation], str]:
    """TorchEngine and HF generate rows, the prompts, the engine's answers and its backend name."""
    vocab = model.get_input_embeddings().weight.shape[0]
    work = make_workload("fixed", vocab, plan.batch, plan.prompt_len, plan.new_tokens)
    on_device = Workload(work.prompts.to(device), work.lengths)
    clock, flops = synced_clock(device), model_flops_per_token(model)
    engine = TorchEngine(model, IdTokenizer(), max_batch_size=plan.batch, stop_token_ids=[],
                         device=device, prefix_cache_mb=0)  # fmt: skip
    try:
        prompts = work.prompts.tolist()
        # the warm-up run: its answers are the train step's samples
        answers = engine.generate_many(prompts, SamplingParams(max_tokens=plan.new_tokens))
        failed = [a.error for a in answers if a.finish_reason == "error"]
        if failed:
            raise RuntimeError(f"{name}: the engine failed: {failed[0]}")
        eng = repeat(lambda: run_engine(engine, work), clock, plan.runs, budget.next_cell())
        backend = type(engine.backend).__name__
    finally:
        engine.shutdown()
    run_hf(model, Workload(on_device.prompts, [2] * plan.batch))  # warm-up
    hf = repeat(lambda: run_hf(model, on_device), clock, plan.runs, budget.next_cell())
    rows = [Row(name, "decode TorchEngine", eng, flops), Row(name, "decode HF generate", hf, flops)]
    return rows, prompts, answers, backend


def grpo_samples(
    prompts: list[list[int]], answers: list[Generation], group: int, algo: Any
) -> list[Sample]:
    """Training samples: prompt + answer, `group` consecutive answers a group, half of each
    group rewarded 1 (the others 0) so that every sample has a non-zero GRPO advantage."""
    groups = len(prompts) // group
    rewards = torch.tensor([[float(k % 2) for k in range(group)]] * groups)  # (N, G)
    advantages = group_advantages(algo, rewards).advantages  # (N, G)
    if advantages is None:
        raise ValueError(f"algorithm {algo.name!r} has no group advantages; use a GRPO preset")
    samples = []
    for i, (prompt, answer) in enumerate(zip(prompts, answers, strict=True)):
        n, k = divmod(i, group)
        samples.append(
            Sample(
                token_ids=prompt + answer.token_ids,
                mask=[0] * len(prompt) + [1] * len(answer.token_ids),
                sampler_logprobs=[0.0] * len(prompt) + answer.logprobs,
                advantage=float(advantages[n, k]),
                reward=float(rewards[n, k]),
            )
        )
    return samples


def bench_train(
    name: str, model: Any, samples: list[Sample], dtype_name: str, device: torch.device,
    plan: Plan, budget: Budget,
) -> Row:  # fmt: skip
    """Forwarded positions per second of the trainer's GRPO update, after one warm-up step."""
    cfg = load_config(None, {"model.dtype": dtype_name})  # the trainer's defaults otherwise
    compute = compute_dtype(cfg.model.dtype, device, lambda msg: print(msg, file=sys.stderr))
    optimizer = make_optimizer(model, None, cfg.optim)
    ctx = UpdateContext(
        model=for_scoring(model, None, compute), optimizer=optimizer,
        scheduler=make_scheduler(optimizer, cfg.optim, plan.steps + 1),
        algo=cfg.algorithm.resolve(sampler_shares_weights=False), pad_id=0, device=device,
        temperature=cfg.rollout.temperature, micro_batch_tokens=cfg.trainer.micro_batch_tokens,
        grad_clip=cfg.optim.grad_clip,
    )  # fmt: skip

    def step() -> int:
        stats = train_on_batch(ctx, samples)
        if stats.get("nonfinite_skipped"):
            raise RuntimeError(f"{name}: the train step's loss or gradient was not finite")
        return int(stats["forward_positions"])

    step()  # warm-up: AdamW's state, the allocator's pools
    rates = repeat(step, synced_clock(device), plan.steps, budget.next_cell())
    return Row(name, "train GRPO step", rates, model_flops_per_token(model))


def check_model(
    name: str, shape: Shape, plan: Plan, dtype_name: str, device: torch.device, budget: Budget
) -> tuple[list[Row], dict[str, Any]]:
    """The three rows of one model and what the JSON says about it (parameters, engine backend)."""
    model = build_model(shape, device)  # float32 master weights, as the trainer holds them
    sampler = copy.deepcopy(model).to(DTYPES[dtype_name])
    rows, prompts, answers, backend = bench_decode(name, sampler, plan, device, budget)
    del sampler
    algo = load_config(None).algorithm.resolve(sampler_shares_weights=False)
    samples = grpo_samples(prompts, answers, plan.group, algo)
    rows.append(bench_train(name, model, samples, dtype_name, device, plan, budget))
    info = {
        "shape": asdict(shape),
        "parameters": sum(p.numel() for p in model.parameters()),
        "forward_flops_per_token": model_flops_per_token(model),
        "engine_backend": backend,
    }
    del model
    if device.type == "cuda":
        info["max_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    return rows, info


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--models", nargs="+", choices=sorted(SHAPES), default=list(SHAPES))
    p.add_argument("--device", default="cuda", help="cuda (the default) or cpu (with --tiny)")
    p.add_argument("--tiny", action="store_true", help="tiny shapes and workload, float32")
    p.add_argument("--dtype", choices=sorted(DTYPES), help="default bfloat16 (float32 with --tiny)")
    p.add_argument("--budget", type=float, default=360.0,
                   help="seconds for the repetitions (each cell runs at least once)")  # fmt: skip
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    for field, value in asdict(Plan()).items():
        p.add_argument(f"--{field.replace('_', '-')}", type=int, help=f"default {value}")
    return p.parse_args(argv)


def make_plan(args: argparse.Namespace) -> Plan:
    """The workload: the full or tiny plan, with the flags given; exits on a batch of part groups."""
    base = TINY_PLAN if args.tiny else Plan()
    given = {k: getattr(args, k) for k in asdict(base) if getattr(args, k) is not None}
    plan = replace(base, **given)
    if min(asdict(plan).values()) < 1 or plan.batch % plan.group:
        raise SystemExit(
            f"error: --batch {plan.batch} must be a positive multiple of --group {plan.group} "
            "(GRPO groups) and every size >= 1"
        )
    return plan


def device_name(device: torch.device) -> str:
    """The GPU's name, or `cpu`."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def report(rows: list[Row], peak: float, meta: dict[str, Any], path: Path | None) -> None:
    """Print the table; write everything as JSON to `path` when given."""
    print(format_table(rows, peak))
    if path is None:
        return
    cells = [
        {**asdict(r), "median_tokens_per_s": r.median, "tflops": r.tflops, "mfu": r.tflops / peak}
        for r in rows
    ]
    write_text_atomically(path, json.dumps({**meta, "peak_tflops": peak, "rows": cells}, indent=2))
    print(f"wrote {path}")


def run_models(
    args: argparse.Namespace, plan: Plan, dtype_name: str, device: torch.device
) -> tuple[list[Row], dict[str, Any]]:
    """Every model's rows and facts, in order, until the budget is spent."""
    budget = Budget(args.budget, cells=3 * len(args.models))
    rows: list[Row] = []
    models: dict[str, Any] = {}
    for name in args.models:
        if budget.spent():
            print(
                f"skipped {name}: --budget {args.budget:g} s is spent; raise it or pass fewer --models"
            )
            continue
        label = f"{name} (tiny)" if args.tiny else name
        shape = tiny_shape(SHAPES[name]) if args.tiny else SHAPES[name]
        model_rows, info = check_model(label, shape, plan, dtype_name, device, budget)
        rows += model_rows
        models[label] = info
        print(f"{label}: {info['parameters'] / 1e6:.1f}M parameters, engine backend "
              f"{info['engine_backend']}", flush=True)  # fmt: skip
    return rows, models


def main(argv: list[str] | None = None) -> int:
    """Measure, print the table, write the JSON; 2 when no CUDA device is there to measure."""
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(NO_CUDA, file=sys.stderr)
        return 2
    start = time.monotonic()
    plan = make_plan(args)
    dtype_name = args.dtype or ("float32" if args.tiny else "bfloat16")
    peak = matmul_tflops(plan.matmul_size, plan.matmul_repeats, DTYPES[dtype_name], device)
    print(f"{device_name(device)}; torch {torch.__version__}; {dtype_name}; "
          f"matmul {plan.matmul_size}^3: {peak:.3g} TFLOP/s (the MFU's peak)")  # fmt: skip
    rows, models = run_models(args, plan, dtype_name, device)
    meta = {
        "device": device_name(device), "torch": torch.__version__, "dtype": dtype_name,
        "plan": asdict(plan), "models": models, "seconds": time.monotonic() - start,
        "flops": "decode 2N per generated token, train 6N per forwarded position; N: parameters "
        "outside the input embedding; attention's quadratic term left out",
    }  # fmt: skip
    report(rows, peak, meta, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
