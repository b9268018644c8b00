"""TorchEngine: logprobs match a plain HF forward, continuous batching is exact, seeds, stops, limits."""

from __future__ import annotations

import asyncio
import copy
import string

import pytest
import torch
from helpers import small_llama
from tokenizers import Tokenizer, decoders, models
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from looprl.engines.base import Engine, GenerationRequest
from looprl.engines.sampling import RowParams, sample
from looprl.engines.torch_engine import TorchEngine, default_stop_ids
from looprl.types import SamplingParams

CHARS = string.ascii_lowercase + string.digits + " .,:;!?()[]{}<>=+-*/\n"


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character plus `<|im_end|>` (id 0) and `<|endoftext|>` (id 1, eos)."""
    vocab = {"<|im_end|>": 0, "<|endoftext|>": 1}
    for c in CHARS:
        vocab[c] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    fast.add_special_tokens({"additional_special_tokens": ["<|im_end|>"]})
    return fast


TOKENIZER = char_tokenizer()
VOCAB = len(TOKENIZER)
SMALL = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    tie_word_embeddings=True,
    initializer_range=0.3,  # peaked distributions: greedy ties cannot flip on float noise
)


def make_model(kind: str = "llama", seed: int = 0) -> torch.nn.Module:
    """A small randomly initialised causal LM in eval mode."""
    torch.manual_seed(seed)
    if kind == "llama":
        rope = {"rope_type": "default", "rope_theta": 500.0}
        return small_llama(seed, **SMALL, rope_parameters=rope).eval()
    if kind == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**SMALL)).eval()
    return Qwen3ForCausalLM(Qwen3Config(**SMALL)).eval()


def prompts(n: int, seed: int = 1) -> list[list[int]]:
    """`n` random prompts of different lengths (3..22 tokens), avoiding the special ids."""
    g = torch.Generator().manual_seed(seed)
    lengths = [3 + (7 * i) % 20 for i in range(n)]
    return [torch.randint(2, VOCAB, (k,), generator=g).tolist() for k in lengths]


def hf_logprobs(model: torch.nn.Module, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """log_softmax of a plain full forward pass at each sampled token."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0]  # (T, V)
    logp = torch.log_softmax(logits[len(prompt) - 1 : -1].float(), dim=-1)
    return logp.gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def hf_greedy(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    """Greedy continuation by full forward passes (no cache): the one-at-a-time reference."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


@pytest.fixture
def llama() -> torch.nn.Module:
    return make_model("llama")


@pytest.fixture
def engine(llama):
    eng = TorchEngine(llama, TOKENIZER, max_batch_size=4, stop_token_ids=[], device="cpu")
    yield eng
    eng.shutdown()


async def gather(engine: TorchEngine, reqs: list[tuple[list[int], SamplingParams]]):
    return await asyncio.gather(
        *(engine.generate(GenerationRequest(prompt_ids=p, sampling=s)) for p, s in reqs)
    )


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
async def test_logprobs_match_hf_forward(kind):
    model = make_model(kind)
    eng = TorchEngine(model, TOKENIZER, max_batch_size=3, stop_token_ids=[], device="cpu")
    assert eng.backend_name == "kv"
    assert isinstance(eng, Engine)
    reqs = [(p, SamplingParams(max_tokens=6 + i, seed=i)) for i, p in enumerate(prompts(7))]
    gens = await gather(eng, reqs)
    await eng.close()
    for (p, _), g in zip(reqs, gens, strict=True):
        assert g.finish_reason == "length" and len(g.token_ids) == len(g.logprobs)
        ref = hf_logprobs(model, p, g.token_ids)
        assert torch.allclose(torch.tensor(g.logprobs), ref, atol=1e-4), (g.logprobs, ref)


async def test_hf_fallback_backend_matches_forward(llama):
    eng = TorchEngine(llama, TOKENIZER, max_batch_size=5, stop_token_ids=[], backend="hf")
    assert eng.backend_name == "hf"
    ps = prompts(3)
    reqs = [(p, SamplingParams(max_tokens=5, seed=i)) for i, p in enumerate([*ps, ps[0], ps[0]])]
    gens = await gather(eng, reqs)  # the copies of ps[0] share its prefill (deep-copied cache)
    await eng.close()
    assert eng.stats.prefill_tokens_saved == 2 * len(ps[0])
    for (p, _), g in zip(reqs, gens, strict=True):
        ref = hf_logprobs(llama, p, g.token_ids)
        assert torch.allclose(torch.tensor(g.logprobs), ref, atol=1e-4)


async def test_greedy_continuous_batching_equals_one_at_a_time(llama, engine):
    ps = prompts(11)
    reqs = [
        (p, SamplingParams(max_tokens=3 + (5 * i) % 9, temperature=0.0)) for i, p in enumerate(ps)
    ]
    gens = await gather(engine, reqs)  # 11 requests through 4 slots: slots are refilled
    for (p, s), g in zip(reqs, gens, strict=True):
        assert g.token_ids == hf_greedy(llama, p, s.max_tokens)
        assert torch.allclose(
            torch.tensor(g.logprobs), hf_logprobs(llama, p, g.token_ids), atol=1e-4
        )
    assert engine.stats.requests == 11 and engine.stats.generated_tokens == sum(
        len(g.token_ids) for g in gens
    )


async def test_identical_prompts_share_prefill(llama, engine):
    p = prompts(1)[0]
    with engine._cond:  # the scheduler waits for the lock, then admits all four at once
        futures = [
            asyncio.ensure_future(
                engine.generate(
                    GenerationRequest(prompt_ids=p, sampling=SamplingParams(max_tokens=8, seed=i))
                )
            )
            for i in range(4)
        ]
        await asyncio.sleep(0)  # each request is queued
    gens = await asyncio.gather(*futures)
    assert engine.stats.prefill_tokens_saved == 3 * len(p)
    assert len({tuple(g.token_ids) for g in gens}) > 1  # different seeds, different samples
    for g in gens:
        assert torch.allclose(
            torch.tensor(g.logprobs), hf_logprobs(llama, p, g.token_ids), atol=1e-4
        )


async def test_seed_reproducible_independent_of_batch(engine):
    p = prompts(1, seed=5)[0]
    alone = await engine.generate(
        GenerationRequest(prompt_ids=p, sampling=SamplingParams(max_tokens=12, seed=7))
    )
    crowd = [(q, SamplingParams(max_tokens=12, seed=100 + i)) for i, q in enumerate(prompts(5))]
    together = await gather(engine, [*crowd, (p, SamplingParams(max_tokens=12, seed=7))])
    other = await engine.generate(
        GenerationRequest(prompt_ids=p, sampling=SamplingParams(max_tokens=12, seed=8))
    )
    assert together[-1].token_ids == alone.token_ids
    assert other.token_ids != alone.token_ids


def test_engine_seed_changes_samples(llama):
    ps, sp = prompts(3), SamplingParams(max_tokens=10)  # no request seed: engine seed + arrival
    runs = []
    for seed in (0, 0, 1):
        eng = TorchEngine(llama, TOKENIZER, stop_token_ids=[], seed=seed)
        runs.append([g.token_ids for g in eng.generate_many(ps, sp)])
        eng.shutdown()
    assert runs[0] == runs[1] and runs[0] != runs[2]


async def test_stop_string_ends_right_after_completing_token(engine):
    p = prompts(1, seed=9)[0]
    full = await engine.generate(
        GenerationRequest(prompt_ids=p, sampling=SamplingParams(max_tokens=20, temperature=0))
    )
    stop = full.text[-5:-3]
    # the fewest tokens whose text contains the stop string
    first = next(k for k in range(1, 21) if stop in TOKENIZER.decode(full.token_ids[:k]))
    g = await engine.generate(
        GenerationRequest(
            prompt_ids=p, sampling=SamplingParams(max_tokens=20, temperature=0, stop=[stop])
        )
    )
    assert g.finish_reason == "stop"
    assert g.token_ids == full.token_ids[:first]
    assert g.text.endswith(stop) and len(g.logprobs) == first


async def test_stop_token_is_kept(llama):
    p = prompts(1, seed=4)[0]
    greedy = hf_greedy(llama, p, 10)
    stop_id = greedy[4]
    eng = TorchEngine(llama, TOKENIZER, stop_token_ids=[stop_id])
    g = await eng.generate(
        GenerationRequest(prompt_ids=p, sampling=SamplingParams(max_tokens=10, temperature=0))
    )
    await eng.close()
    cut = greedy.index(stop_id) + 1
    assert g.finish_reason == "stop" and g.token_ids == greedy[:cut]


def test_default_stop_ids_include_eos_and_im_end(llama):
    llama.generation_config.eos_token_id = [1, 7]
    assert default_stop_ids(llama, TOKENIZER) == {0, 1, 7}


async def test_top_k_one_and_tiny_top_p_equal_greedy(engine):
    ps = prompts(4, seed=2)
    greedy = await gather(engine, [(p, SamplingParams(max_tokens=8, temperature=0)) for p in ps])
    topk = await gather(
        engine, [(p, SamplingParams(max_tokens=8, temperature=0.8, top_k=1, seed=1)) for p in ps]
    )
    topp = await gather(
        engine, [(p, SamplingParams(max_tokens=8, temperature=1.3, top_p=1e-6, seed=2)) for p in ps]
    )
    for a, b, c in zip(greedy, topk, topp, strict=True):
        assert a.token_ids == b.token_ids == c.token_ids


def test_sample_truncation_and_logprobs_before_truncation():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 2))
    seen: set[int] = set()
    for i in range(50):
        u = i / 50
        toks, lps = sample(logits, [RowParams(1.0, top_k=2), RowParams(1.0, top_p=0.7)], [u, u])
        seen.update(toks)
        assert lps[0] == pytest.approx(float(logits[0, toks[0]]), abs=1e-6)  # untruncated logprob
    assert seen == {0, 1}
    toks, lps = sample(logits, [RowParams(0.0), RowParams(2.0)], [0.999, 0.999])
    assert toks[0] == 0 and lps[0] == pytest.approx(float(logits[0, 0]), abs=1e-6)
    assert toks[1] == 3 and lps[1] == pytest.approx(
        float(torch.log_softmax(logits[1] / 2, -1)[3]), abs=1e-6
    )


async def test_length_finish_at_max_tokens_and_context(llama):
    eng = TorchEngine(llama, TOKENIZER, stop_token_ids=[], max_seq_len=20)
    p = prompts(3)[2][:15]
    short, ctx = await gather(
        eng, [(p, SamplingParams(max_tokens=3)), (p, SamplingParams(max_tokens=50))]
    )
    await eng.close()
    assert short.finish_reason == "length" and len(short.token_ids) == 3
    assert ctx.finish_reason == "length" and len(ctx.token_ids) == 20 - 15


async def test_bad_requests_error_while_others_complete(llama):
    eng = TorchEngine(llama, TOKENIZER, stop_token_ids=[], max_seq_len=32, max_batch_size=2)
    good = prompts(3)
    bad = [
        (list(range(2, 40)), SamplingParams(max_tokens=4)),  # prompt longer than the context
        ([], SamplingParams()),
        ([VOCAB + 5], SamplingParams()),
        (good[0], SamplingParams(temperature=-1)),
    ]
    gens = await gather(eng, [bad[0], *[(p, SamplingParams(max_tokens=6)) for p in good], *bad[1:]])
    await eng.close()
    assert [g.finish_reason for g in gens] == [
        "error",
        "length",
        "length",
        "length",
        "error",
        "error",
        "error",
    ]
    assert "max_seq_len" in (gens[0].error or "")
    assert all(len(g.token_ids) == 6 for g in gens[1:4])


async def test_sync_weights_and_shared_weights(llama):
    source = make_model("llama", seed=42)
    copy_model = copy.deepcopy(llama)
    eng = TorchEngine(copy_model, TOKENIZER, stop_token_ids=[])
    p, sp = prompts(1)[0], SamplingParams(max_tokens=10, temperature=0)
    before = await eng.generate(GenerationRequest(prompt_ids=p, sampling=sp))
    eng.sync_weights(source)
    after = await eng.generate(GenerationRequest(prompt_ids=p, sampling=sp))
    assert after.token_ids != before.token_ids
    assert after.token_ids == hf_greedy(source, p, 10)
    with torch.no_grad():  # shared mode: an in-place update is seen without any sync
        for param in copy_model.parameters():
            param.mul_(-1.0)
    flipped = await eng.generate(GenerationRequest(prompt_ids=p, sampling=sp))
    assert flipped.token_ids == hf_greedy(copy_model, p, 10)
    with pytest.raises(ValueError, match="lacks"):
        eng.sync_weights({"nope": torch.zeros(1)})
    await eng.close()


async def test_cancelled_request_frees_its_slot(llama):
    eng = TorchEngine(llama, TOKENIZER, stop_token_ids=[], max_batch_size=1, max_seq_len=256)
    p = prompts(1)[0]
    slow = asyncio.ensure_future(
        eng.generate(GenerationRequest(prompt_ids=p, sampling=SamplingParams(max_tokens=200)))
    )
    await asyncio.sleep(0.05)
    slow.cancel()
    g = await asyncio.wait_for(
        eng.generate(GenerationRequest(prompt_ids=p, sampling=SamplingParams(max_tokens=3))), 10
    )
    assert len(g.token_ids) == 3
    await eng.close()
    closed = await eng.generate(GenerationRequest(prompt_ids=p))
    assert closed.finish_reason == "error" and "closed" in (closed.error or "")


async def test_every_active_request_cancelled_is_not_a_failed_step(llama, caplog):
    eng = TorchEngine(llama, TOKENIZER, stop_token_ids=[], max_batch_size=2, max_seq_len=256)
    p = prompts(1)[0]
    slow = [
        asyncio.ensure_future(
            eng.generate(GenerationRequest(prompt_ids=p, sampling=SamplingParams(max_tokens=200)))
        )
        for _ in range(2)
    ]
    await asyncio.sleep(0.05)
    for f in slow:
        f.cancel()
    await asyncio.sleep(0.05)  # the scheduler finds no one left to decode
    g = await asyncio.wait_for(
        eng.generate(GenerationRequest(prompt_ids=p, sampling=SamplingParams(max_tokens=3))), 10
    )
    assert len(g.token_ids) == 3
    assert "step failed" not in caplog.text
    await eng.close()


async def test_failed_step_errors_its_requests_and_engine_recovers(llama, engine, monkeypatch):
    real_decode = engine.backend.decode
    calls = {"n": 0}

    def flaky(tokens, positions):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("simulated out of memory")
        return real_decode(tokens, positions)

    monkeypatch.setattr(engine.backend, "decode", flaky)
    p = prompts(1)[0]
    broken = await engine.generate(
        GenerationRequest(prompt_ids=p, sampling=SamplingParams(max_tokens=5))
    )
    assert broken.finish_reason == "error" and "simulated out of memory" in (broken.error or "")
    ok = await engine.generate(
        GenerationRequest(prompt_ids=p, sampling=SamplingParams(max_tokens=5, temperature=0))
    )
    assert ok.finish_reason == "length" and ok.token_ids == hf_greedy(llama, p, 5)


async def test_release_memory_when_idle(engine):
    p = prompts(1)[0]
    await engine.generate(GenerationRequest(prompt_ids=p, sampling=SamplingParams(max_tokens=3)))
    assert engine.backend.allocated_bytes > 0
    assert engine.release_memory()
    assert engine.backend.allocated_bytes == 0
    again = await engine.generate(
        GenerationRequest(prompt_ids=p, sampling=SamplingParams(max_tokens=3))
    )
    assert len(again.token_ids) == 3


async def test_shutdown_frees_the_caches(llama):
    """A closed engine holds no KV or prefix cache, even while its caller keeps it referenced
    (a bootstrap round's cache of 256 attempts takes gigabytes)."""
    engine = TorchEngine(llama, TOKENIZER, max_batch_size=4, stop_token_ids=[], device="cpu")
    p = prompts(1)[0]
    await engine.generate(GenerationRequest(prompt_ids=p, sampling=SamplingParams(max_tokens=3)))
    assert (
        engine.backend.allocated_bytes > 0 and engine._prefix is not None and engine._prefix.entries
    )
    await engine.close()
    assert engine.backend.allocated_bytes == 0 and not engine._prefix.entries
    engine.shutdown()  # twice is harmless


async def test_prefix_shared_by_new_tasks_is_prefilled_once(llama, engine):
    system = torch.randint(2, VOCAB, (40,), generator=torch.Generator().manual_seed(5)).tolist()
    tasks = [system + tail for tail in prompts(3, seed=6)]  # one system prompt, three questions
    sp = SamplingParams(max_tokens=4, temperature=0)
    with engine._cond:  # the scheduler waits for the lock, then admits all three at once
        futures = [
            asyncio.ensure_future(engine.generate(GenerationRequest(prompt_ids=p, sampling=sp)))
            for p in tasks
        ]
        await asyncio.sleep(0)
    gens = await asyncio.gather(*futures)
    assert engine.stats.shared_prefills == 1
    assert engine.stats.prefill_tokens_saved == 3 * len(system)  # computed once, aside
    for p, g in zip(tasks, gens, strict=True):
        assert g.token_ids == hf_greedy(llama, p, 4)
        assert torch.allclose(
            torch.tensor(g.logprobs), hf_logprobs(llama, p, g.token_ids), atol=1e-4
        )


async def test_next_turn_reuses_cached_prefix(llama, engine):
    p = prompts(1, seed=11)[0]
    turn1 = await engine.generate(
        GenerationRequest(prompt_ids=p, sampling=SamplingParams(max_tokens=6, temperature=0))
    )
    tool_reply = [5, 6, 7, 8]
    p2 = p + turn1.token_ids + tool_reply
    turn2 = await engine.generate(
        GenerationRequest(prompt_ids=p2, sampling=SamplingParams(max_tokens=6, seed=3))
    )
    assert engine.stats.prefix_hits == 1
    assert engine.stats.prefill_tokens_saved == len(p) + len(turn1.token_ids) - 1
    assert turn1.token_ids == hf_greedy(llama, p, 6)
    ref = hf_logprobs(llama, p2, turn2.token_ids)
    assert torch.allclose(torch.tensor(turn2.logprobs), ref, atol=1e-4)


async def test_prefix_cache_is_dropped_when_weights_change(llama, engine):
    p = prompts(1, seed=12)[0]
    sp = SamplingParams(max_tokens=5, temperature=0)
    first = await engine.generate(GenerationRequest(prompt_ids=p, sampling=sp))
    with torch.no_grad():  # an optimizer step in place, without telling the engine
        for param in llama.parameters():
            param.add_(0.05 * torch.randn_like(param))
    p2 = p + first.token_ids
    again = await engine.generate(GenerationRequest(prompt_ids=p2, sampling=sp))
    assert engine.stats.prefix_hits == 0
    assert again.token_ids == hf_greedy(llama, p2, 5)


def test_prefix_cache_lru_and_longest_prefix():
    from looprl.engines.prefix_cache import PrefixCache, PrefixEntry

    def entry(tokens: list[int]) -> PrefixEntry:
        kv = torch.zeros(1, 1, len(tokens), 2)  # 8 bytes per token each
        return PrefixEntry(tokens, kv, kv.clone())

    cache = PrefixCache(budget_bytes=16 * 10)  # room for 10 tokens
    cache.put(entry([1, 2, 3]))
    cache.put(entry([1, 2, 3, 4, 5]))
    cache.put(entry([9, 9]))
    assert len(cache.entries) == 3 and cache.nbytes == 160
    cache.put(entry([7]))  # evicts the oldest entry
    assert [e.tokens for e in cache.entries.values()] == [[1, 2, 3, 4, 5], [9, 9], [7]]
    hit = cache.take([1, 2, 3, 4, 5, 6])
    assert hit is not None and hit[0] == 5
    assert cache.take([1, 2, 3, 4, 5, 6]) is None  # taken, not shared
    hit = cache.take([9, 9])  # the last prompt token is always recomputed
    assert hit is not None and hit[0] == 1


@pytest.mark.filterwarnings("ignore::FutureWarning")  # peft calls deprecated transformers APIs
async def test_lora_model_falls_back_to_its_own_forward(llama):
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(
        llama, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    eng = TorchEngine(lora, TOKENIZER, stop_token_ids=[])
    assert eng.backend_name == "hf"  # the fast path would silently skip the adapters
    p = prompts(1)[0]
    g = await eng.generate(
        GenerationRequest(prompt_ids=p, sampling=SamplingParams(max_tokens=5, seed=1))
    )
    await eng.close()
    assert torch.allclose(torch.tensor(g.logprobs), hf_logprobs(lora, p, g.token_ids), atol=1e-4)


async def test_tiny_model_chat_turn(tiny):
    model, tokenizer = tiny
    eng = TorchEngine(model, tokenizer)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in eng.stop_token_ids
    msgs = [{"role": "user", "content": "What is 3 + 4?"}]
    prompt = list(
        tokenizer.apply_chat_template(
            msgs, add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
    )
    g = await eng.generate(
        GenerationRequest(prompt_ids=prompt, sampling=SamplingParams(max_tokens=40, seed=0))
    )
    await eng.close()
    assert g.finish_reason in ("stop", "length") and g.token_ids
    if g.finish_reason == "stop":
        assert g.token_ids[-1] in eng.stop_token_ids
    assert torch.allclose(
        torch.tensor(g.logprobs), hf_logprobs(model, prompt, g.token_ids), atol=1e-4
    )
