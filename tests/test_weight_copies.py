"""Fused projections and MKL-packed weights: same logits and tokens as the plain path, never stale."""

from __future__ import annotations

import copy

import pytest
import torch
from test_torch_engine import TOKENIZER, hf_greedy, make_model, prompts

from looprl.engines import weight_copies
from looprl.engines.base import GenerationRequest
from looprl.engines.kv_model import LlamaKVModel
from looprl.engines.threads import torch_threads
from looprl.engines.torch_engine import TorchEngine
from looprl.engines.weight_copies import PackedLinear, mkl_packing_works
from looprl.types import SamplingParams

ATOL = RTOL = 1e-5  # fusion and packing change the matmul's blocking and so the rounding
needs_mkl = pytest.mark.skipif(not mkl_packing_works(), reason="no MKL packed sgemm in this torch")


def greedy_run(kv: LlamaKVModel, ps: list[list[int]], steps: int) -> tuple[list, torch.Tensor]:
    """Prefill `ps`, then decode greedily `steps` times; the tokens and every step's logits."""
    kv.reserve(len(ps), max(map(len, ps)) + steps + 1)
    logits = kv.prefill(ps, 0)  # (n, V)
    positions = torch.tensor([len(p) for p in ps])
    tokens, seen = [], [logits]
    for _ in range(steps):
        tok = logits.argmax(-1)  # (n,)
        tokens.append(tok.tolist())
        logits = kv.decode(tok, positions)
        positions += 1
        seen.append(logits)
    return tokens, torch.stack(seen)  # (steps + 1, n, V)


def assert_same(a: LlamaKVModel, b: LlamaKVModel, steps: int = 6) -> None:
    """Both backends produce the same greedy tokens and logprobs within ATOL."""
    ps = prompts(5)
    with torch.inference_mode():
        tok_a, logits_a = greedy_run(a, ps, steps)
        tok_b, logits_b = greedy_run(b, ps, steps)
    assert tok_a == tok_b
    torch.testing.assert_close(
        logits_a.log_softmax(-1), logits_b.log_softmax(-1), atol=ATOL, rtol=RTOL
    )


@pytest.fixture(autouse=True)
def pack_small_matrices(monkeypatch):
    """These models' matrices are far below PACK_MIN_WEIGHTS: pack them anyway, to test packing."""
    monkeypatch.setattr(weight_copies, "PACK_MIN_WEIGHTS", 0)


COPIES = [
    {"fuse": True},
    pytest.param({"pack": True}, marks=needs_mkl),
    pytest.param({"fuse": True, "pack": True}, marks=needs_mkl),
]


@pytest.mark.parametrize("copies", COPIES)
@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_weight_copies_match_the_plain_path(kind, copies):
    model = make_model(kind)
    fast = LlamaKVModel(model, max_slots=8, max_seq_len=256, **copies)
    assert fast.copies is not None and (fast.head is not None) == copies.get("pack", False)
    assert_same(fast, LlamaKVModel(model, max_slots=8, max_seq_len=256))


@pytest.mark.parametrize("copies", COPIES)
def test_weight_copies_follow_optimizer_steps_and_replaced_parameters(copies):
    model = make_model("qwen2")  # q/k/v biases are copied too
    fast = LlamaKVModel(model, max_slots=8, max_seq_len=256, **copies)
    plain = LlamaKVModel(model, max_slots=8, max_seq_len=256)
    assert_same(fast, plain)  # builds the copies
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    model(torch.tensor([prompts(1)[0]])).logits.sum().backward()
    opt.step()
    assert_same(fast, plain)  # the step bumped the weights' version counters
    other = make_model("qwen2", seed=7).state_dict()
    model.load_state_dict(other, assign=True)  # new tensors replace the parameters
    assert_same(fast, plain)
    fast.release()  # drops the copies with the cache; the next forward rebuilds them
    assert_same(fast, plain)


@needs_mkl
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 16, 63, 64, 65, 256, 300])
def test_packed_linear_equals_f_linear_at_every_row_count(rows):
    gen = torch.Generator().manual_seed(rows)
    weight, bias = torch.randn(200, 96, generator=gen), torch.randn(200, generator=gen)
    x = torch.randn(2, rows, 96, generator=gen)[0]
    torch.testing.assert_close(
        PackedLinear(weight, bias)(x),
        torch.nn.functional.linear(x, weight, bias),
        atol=1e-5,
        rtol=0,
    )


def test_a_model_of_small_matrices_is_not_packed(monkeypatch):
    model = make_model("llama")
    biggest = max(p.numel() for p in model.parameters() if p.dim() == 2)
    monkeypatch.setattr(weight_copies, "PACK_MIN_WEIGHTS", biggest + 1)
    kv = LlamaKVModel(model, max_slots=8, max_seq_len=256, pack=True)
    assert not kv.pack and kv.copies is None and kv.head is None


def test_torch_engine_packs_by_default_and_can_be_told_not_to():
    model = make_model("llama")
    packed = TorchEngine(model, TOKENIZER, stop_token_ids=[], device="cpu")
    plain = TorchEngine(model, TOKENIZER, stop_token_ids=[], device="cpu", pack_weights=False)
    assert isinstance(packed.backend, LlamaKVModel) and isinstance(plain.backend, LlamaKVModel)
    assert packed.backend.pack == mkl_packing_works() and plain.backend.pack is False
    sp = SamplingParams(max_tokens=8, temperature=0)
    a, b = packed.generate_many(prompts(5), sp), plain.generate_many(prompts(5), sp)
    packed.shutdown(), plain.shutdown()
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(
            torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=ATOL, rtol=RTOL
        )


@pytest.mark.parametrize("copies", [{"fuse_projections": True}, {"pack_weights": True}])
async def test_update_behind_version_counter_is_seen_after_sync_weights(copies):
    model = make_model("llama")
    eng = TorchEngine(model, TOKENIZER, stop_token_ids=[], device="cpu", **copies)
    p, sp = prompts(1)[0], SamplingParams(max_tokens=10, temperature=0)
    before = await eng.generate(GenerationRequest(prompt_ids=p, sampling=sp))
    reference = copy.deepcopy(model)
    for param in model.parameters():
        param.data.mul_(-1.0)  # `.data` does not move autograd's version counter
    eng.sync_weights(None)  # shared placement after every step
    after = await eng.generate(GenerationRequest(prompt_ids=p, sampling=sp))
    await eng.close()
    assert before.token_ids == hf_greedy(reference, p, 10)
    assert after.token_ids == hf_greedy(model, p, 10) != before.token_ids


@pytest.mark.parametrize("threads", [1, None])
def test_engine_steps_run_on_its_threads_and_restore_the_default(threads):
    previous = torch.get_num_threads()
    torch.set_num_threads(2)  # the process default the engine's worker thread starts with
    try:
        eng = TorchEngine(make_model("llama"), TOKENIZER, stop_token_ids=[], threads=threads)
        seen: dict[str, set[int]] = {"prefill": set(), "decode": set()}
        for name in seen:
            original = getattr(eng.backend, name)

            def spy(*args, _name=name, _original=original):
                seen[_name].add(torch.get_num_threads())
                return _original(*args)

            setattr(eng.backend, name, spy)
        gens = eng.generate_many(prompts(3), SamplingParams(max_tokens=4))
        eng.shutdown()
        assert [len(g.token_ids) for g in gens] == [4, 4, 4]
        assert seen == {"prefill": {threads or 2}, "decode": {threads or 2}}
        assert torch.get_num_threads() == 2  # this thread's count is its own
    finally:
        torch.set_num_threads(previous)


def test_torch_threads_sets_and_restores_the_count():
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with torch_threads(1):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with torch_threads(None):
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)
