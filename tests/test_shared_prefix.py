"""Tier 1 and 3: a micro-batch forwarded as one prefix tree scores and trains like per-sample rows.

The tree's layout is checked by hand and against a brute-force ancestor relation; its logprobs,
entropy, hidden states and gradients against the padded per-sample forward; two optimizer steps
(full weights, LoRA, PPO's value head, KL and two updates per batch) against the unshared path.
"""

from __future__ import annotations

import random

import pytest
import torch
from helpers import small_model

from looprl.algorithms.presets import resolve_algorithm
from looprl.models import forward as F
from looprl.trainer import batch as B
from looprl.trainer import update as U
from looprl.trainer.config import OptimSection
from looprl.trainer.setup import make_optimizer, make_scheduler

# float32 logprobs, entropy and hidden states of the tree against padded rows: measured at most
# 4.8e-7 apart on the small Llama (SDPA and eager): a tree row sums attention over the same keys
# in another order
SCORE_ATOL = 2e-6
# weights after 2 AdamW steps (lr 1e-2), 3 seeds: measured at most 8.7e-6 apart with full weights
# (KL, two updates, PPO), 3.2e-7 with LoRA, against a real change of ~1e-2: where a gradient is
# near 0, Adam's g / sqrt(v) turns float32 summation-order noise into a visible part of a step.
# The batch loss measured at most 6.2e-8 apart
WEIGHT_ATOL, LOSS_ATOL = 2e-5, 1e-6


def _sample(ids: list[int], prompt: int, adv: float) -> B.Sample:
    mask = [0] * prompt + [1] * (len(ids) - prompt)
    lps = [0.0] * prompt + [-0.5] * (len(ids) - prompt)
    return B.Sample(ids, mask, lps, adv, adv)


def grouped_samples(seed: int = 0, groups: int = 3, size: int = 4) -> list[B.Sample]:
    """GRPO-shaped samples: a system prompt shared by all, a task per group, two-turn episodes.

    Each episode gives two segments (the second extends the first: one training sample per turn
    boundary), plus one sample that shares nothing with the others.
    """
    rng = random.Random(seed)
    system = [rng.randrange(1, 50) for _ in range(10)]
    out = []
    for _g in range(groups):
        task = system + [rng.randrange(1, 50) for _ in range(rng.randint(2, 6))]
        for _k in range(size):
            turn1 = task + [rng.randrange(1, 50) for _ in range(rng.randint(1, 6))]
            adv = rng.uniform(-1.5, 1.5)
            out.append(_sample(turn1, len(task), adv))
            turn2 = turn1 + [rng.randrange(1, 50) for _ in range(rng.randint(2, 5))]
            out.append(_sample(turn2, len(turn1) + 1, adv))
    out.append(_sample([rng.randrange(1, 50) for _ in range(7)], 3, 0.7))  # nothing shared
    return out


def test_tree_layout_by_hand():
    seqs = [[1, 2, 5], [1, 2, 3, 4, 6, 7], [9, 8], [1, 2, 3, 4]]
    p = B.pack_prefixes(seqs, 100)
    # depth-first, lexicographic: 1 2 3 4 | 6 7 | 5 | 9 8
    assert p.input_ids.tolist() == [[1, 2, 3, 4, 6, 7, 5, 9, 8]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 2, 0, 1]]
    assert p.node_index.tolist() == [[0, 1, 6, 0, 0, 0], [0, 1, 2, 3, 4, 5], [7, 8, 0, 0, 0, 0],
                                [0, 1, 2, 3, 0, 0]]  # fmt: skip
    allowed = p.allowed[0, 0]
    assert torch.nonzero(allowed[6]).flatten().tolist() == [0, 1, 6]  # 5 sees 1 2, not 3 4
    assert torch.nonzero(allowed[5]).flatten().tolist() == [0, 1, 2, 3, 4, 5]
    assert torch.nonzero(allowed[8]).flatten().tolist() == [7, 8]  # nothing shared
    assert B.pack_prefixes([[3, 1], [3, 1]], 100).input_ids.tolist() == [[3, 1]]  # duplicates: once


def test_rows_of_a_capped_tree_by_hand():
    seqs = [[1, 2, 5], [1, 2, 3, 4, 6, 7], [9, 8], [1, 2, 3, 4]]
    p = B.pack_prefixes(seqs, 6)  # 1 2 3 4 6 7 fills a row; 1 2 5 starts again, 9 8 joins it
    assert p.input_ids.tolist() == [[1, 2, 3, 4, 6, 7], [1, 2, 5, 9, 8, 0]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 4, 5], [0, 1, 2, 0, 1, 0]]
    assert p.node_index[0].tolist() == [6, 7, 8, 0, 0, 0]  # row 1 starts at flat node 6
    allowed = p.allowed[:, 0]
    assert torch.nonzero(allowed[1, 4]).flatten().tolist() == [3, 4]  # 8 sees 9 and itself
    assert torch.nonzero(allowed[1, 5]).flatten().tolist() == [5]  # padding sees itself alone
    assert B.prefix_rows(seqs, 6) == [([3, 1], 6), ([0, 2], 5)]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("row_tokens", [10_000, 40])
def test_tree_is_each_distinct_prefix_once_attending_its_ancestors(seed, row_tokens):
    data = grouped_samples(seed)
    seqs = [s.token_ids for s in data]
    p = B.pack_prefixes(seqs, row_tokens)
    rows, width = p.input_ids.shape
    if row_tokens > 1000:  # one row: every distinct prefix exactly once
        assert rows == 1 and width == len({tuple(s[: t + 1]) for s in seqs for t in range(len(s))})
    else:
        assert rows > 1 and width <= max(row_tokens, max(len(s) for s in seqs))
    # flat views: node n is row n // width, column n % width; a node attends within its row
    flat = p.allowed[:, 0].flatten(0, 1)  # (R * L, L)
    for b, s in enumerate(seqs):
        path = p.node_index[b, : len(s)]
        row = int(path[0]) // width
        assert bool((path // width == row).all())
        assert p.input_ids.flatten()[path].tolist() == s
        assert p.position_ids.flatten()[path].tolist() == list(range(len(s)))
        for t in range(len(s)):
            seen = torch.nonzero(flat[path[t]]).flatten() + row * width
            assert set(seen.tolist()) == set(path[: t + 1].tolist())


def test_prefix_micro_batches_hold_whole_rows_within_the_budget():
    data = grouped_samples(1)
    for budget, row_tokens in ((30, 30), (64, 32), (200, 40), (10_000, 10_000)):
        chunks = B.prefix_micro_batches(data, budget, row_tokens)
        assert sorted(id(s) for c in chunks for s in c) == sorted(id(s) for s in data)
        for c in chunks:
            shape = B.pack_prefixes([s.token_ids for s in c], row_tokens).input_ids.shape
            assert shape[0] * shape[1] <= budget or shape[0] == 1
    assert len(B.prefix_micro_batches(data, 10_000, 10_000)) == 1


@pytest.mark.parametrize("row_tokens", [10_000, 40])
@pytest.mark.parametrize("path", ["sdpa", "eager", "plain"])
def test_packed_forward_equals_per_sample_forward(monkeypatch, path, row_tokens):
    model = small_model()
    if path == "plain":  # the model's own forward and logits, not the fused head
        monkeypatch.setattr(F, "_FUSED_HEAD_TYPES", set())
    else:
        model.config._attn_implementation = path
    data = grouped_samples(2)
    rows = B.collate(data, 0, "cpu")
    tree = B.collate(data, 0, "cpu", row_tokens=row_tokens)
    assert tree.packed is not None and tree.positions < rows.positions / 2
    t = (rows.input_ids, rows.attention_mask, rows.targets, rows.loss_mask)
    real = rows.attention_mask[:, :-1] > 0  # (B, T-1)
    scores, grads = [], []
    for packed in (None, tree.packed):
        model.zero_grad()
        s = F.forward_logprobs(model, *t, 0.8, with_entropy=True, entropy_grad=True,
                               with_hidden=True, packed=packed)  # fmt: skip
        assert s.entropy is not None and s.hidden is not None
        (s.logprobs * rows.advantages + 0.1 * s.entropy).sum().backward()
        scores.append((s.logprobs, s.entropy, s.hidden[real]))
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    for a, b in zip(*scores, strict=True):  # logprobs, entropy, hidden states at real positions
        torch.testing.assert_close(a, b, atol=SCORE_ATOL, rtol=0.0)
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=SCORE_ATOL, rtol=1e-5)


def test_attention_without_a_4d_mask_names_the_switch():
    model = small_model()
    model.config._attn_implementation = "flex_attention"
    p = B.pack_prefixes([[1, 2]], 64)
    with pytest.raises(ValueError, match="takes a 4D mask.*trainer.shared_prefix=false"):
        F.tree_attention_mask(model, p.allowed, p.position_ids)


def test_a_sliding_window_model_scores_its_tree_like_its_rows():
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, sliding_window=5)  # fmt: skip
    model = MistralForCausalLM(cfg)
    data = grouped_samples(3)  # sequences of 14 to 27 tokens: the 5-token window cuts
    rows, tree = B.collate(data, 0, "cpu"), B.collate(data, 0, "cpu", row_tokens=10_000)
    t = (rows.input_ids, rows.attention_mask, rows.targets, rows.loss_mask)
    a = F.forward_logprobs(model, *t).logprobs
    b = F.forward_logprobs(model, *t, packed=tree.packed).logprobs
    torch.testing.assert_close(a, b, atol=SCORE_ATOL, rtol=0.0)
    model.config.sliding_window = 1000  # a window nothing reaches: a different model
    assert (F.forward_logprobs(model, *t).logprobs - a).abs().max() > 1e-3


def test_mixed_sliding_and_full_layers_are_packed_only_below_the_window():
    model = small_model()
    model.config.layer_types = ["sliding_attention", "full_attention"]  # as Qwen2 or Gemma
    model.config.sliding_window = 4
    short, long = B.pack_prefixes([[1, 2, 3, 4]], 64), B.pack_prefixes([[1, 2, 3, 4, 5]], 64)
    assert F.tree_attention_mask(model, short.allowed, short.position_ids) is short.allowed
    with pytest.raises(ValueError, match="4-token sliding-window.*shared_prefix=false"):
        F.tree_attention_mask(model, long.allowed, long.position_ids)


def _lora(model: torch.nn.Module) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1)
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"])
    return get_peft_model(model, cfg)


def _train(model, preset: str, data, shared: bool, **overrides) -> list[dict[str, float]]:
    """Two `train_on_batch` calls (rows of 40 tree nodes, micro-batches of 96 positions)."""
    optim = OptimSection(lr=1e-2)
    algo = resolve_algorithm(preset, use_tis=True, **overrides)
    value_head = U.ValueHead(32) if algo.uses_value_head else None
    opt = make_optimizer(model, value_head, optim)
    ctx = U.UpdateContext(
        model=model, optimizer=opt, scheduler=make_scheduler(opt, optim, 4), algo=algo, pad_id=0,
        device=torch.device("cpu"), temperature=1.0, micro_batch_tokens=96, grad_clip=1.0,
        value_head=value_head, ref_model=small_model(seed=3) if algo.kl_coef else None,
        shared_prefix=shared, prefix_row_tokens=40,
    )  # fmt: skip
    return [U.train_on_batch(ctx, data) for _ in range(2)]


CASES = {
    "full": ("grpo", {}),
    "kl_two_updates": ("grpo", {"kl_coef": 0.05, "updates_per_batch": 2}),
    "ppo_value_head": ("ppo", {}),
    "lora": ("dr_grpo", {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_two_steps_on_the_tree_give_the_unshared_weights(case):
    preset, overrides = CASES[case]
    data = grouped_samples(4)
    wrap = _lora if case == "lora" else (lambda m: m)
    start, shared, unshared = wrap(small_model()), wrap(small_model()), wrap(small_model())
    s_stats = _train(shared, preset, data, True, **overrides)
    u_stats = _train(unshared, preset, data, False, **overrides)
    moved = 0.0
    for a, b, c in zip(shared.parameters(), unshared.parameters(), start.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=WEIGHT_ATOL, rtol=0.0)
        moved = max(moved, float((b - c).detach().abs().max()))
    assert moved > 1e-3  # the steps changed the weights, so their agreement means something
    for s, u in zip(s_stats, u_stats, strict=True):
        assert s["loss"] == pytest.approx(u["loss"], abs=LOSS_ATOL)
        assert s["train_tokens"] == u["train_tokens"]
        assert s["forward_positions"] < u["forward_positions"] / 2
