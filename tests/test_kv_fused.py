"""Fused q/k/v and gate/up projections: same logits and tokens as the unfused path, never stale."""

from __future__ import annotations

import copy

import pytest
import torch
from test_torch_engine import TOKENIZER, hf_greedy, make_model, prompts

from looprl.engines.base import GenerationRequest
from looprl.engines.kv_model import LlamaKVModel
from looprl.engines.threads import torch_threads
from looprl.engines.torch_engine import TorchEngine
from looprl.types import SamplingParams

ATOL = 1e-5  # fusion may change the matmul's blocking; on these shapes the logits are bitwise equal


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
        logits_a.log_softmax(-1), logits_b.log_softmax(-1), atol=ATOL, rtol=0
    )


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_fused_projections_match_unfused(kind):
    model = make_model(kind)
    fused = LlamaKVModel(model, max_slots=8, max_seq_len=256, fuse=True)
    assert fused.fused is not None
    assert_same(fused, LlamaKVModel(model, max_slots=8, max_seq_len=256))


def test_fused_weights_follow_optimizer_steps_and_replaced_parameters():
    model = make_model("qwen2")  # q/k/v biases are fused too
    fused = LlamaKVModel(model, max_slots=8, max_seq_len=256, fuse=True)
    plain = LlamaKVModel(model, max_slots=8, max_seq_len=256)
    assert_same(fused, plain)  # builds the fused copies
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    model(torch.tensor([prompts(1)[0]])).logits.sum().backward()
    opt.step()
    assert_same(fused, plain)  # the step bumped the weights' version counters
    other = make_model("qwen2", seed=7).state_dict()
    model.load_state_dict(other, assign=True)  # new tensors replace the parameters
    assert_same(fused, plain)


async def test_update_behind_version_counter_is_seen_after_sync_weights():
    model = make_model("llama")
    eng = TorchEngine(model, TOKENIZER, stop_token_ids=[], device="cpu", fuse_projections=True)
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
