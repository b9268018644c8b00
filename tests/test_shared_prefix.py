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
    p = B.pack_prefixes(seqs)
    # depth-first, lexicographic: 1 2 3 4 | 6 7 | 5 | 9 8
    assert p.input_ids.tolist() == [[1, 2, 3, 4, 6, 7, 5, 9, 8]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 2, 0, 1]]
    assert p.node_index.tolist() == [[0, 1, 6, 0, 0, 0], [0, 1, 2, 3, 4, 5], [7, 8, 0, 0, 0, 0],
                                [0, 1, 2, 3, 0, 0]]  # fmt: skip
    allowed = p.allowed[0, 0]
    assert torch.nonzero(allowed[6]).flatten().tolist() == [0, 1, 6]  # 5 sees 1 2, not 3 4
    assert torch.nonzero(allowed[5]).flatten().tolist() == [0, 1, 2, 3, 4, 5]
    assert torch.nonzero(allowed[8]).flatten().tolist() == [7, 8]  # nothing shared
    assert B.pack_prefixes([[3, 1], [3, 1]]).input_ids.tolist() == [[3, 1]]  # duplicates: once


@pytest.mark.parametrize("seed", range(5))
def test_tree_is_each_distinct_prefix_once_attending_its_ancestors(seed):
    data = grouped_samples(seed)
    seqs = [s.token_ids for s in data]
    p = B.pack_prefixes(seqs)
    prefixes = {tuple(s[: t + 1]) for s in seqs for t in range(len(s))}
    assert p.input_ids.shape[1] == len(prefixes)  # every distinct prefix exactly once
    allowed = p.allowed[0, 0]
    for b, s in enumerate(seqs):
        path = p.node_index[b, : len(s)]
        assert p.input_ids[0, path].tolist() == s
        assert p.position_ids[0, path].tolist() == list(range(len(s)))
        for t in range(len(s)):
            assert set(torch.nonzero(allowed[path[t]]).flatten().tolist()) == set(
                path[: t + 1].tolist()
            )


def test_prefix_micro_batches_count_tree_nodes():
    data = grouped_samples(1)
    for budget in (30, 64, 10_000):
        chunks = B.prefix_micro_batches(data, budget)
        assert sorted(id(s) for c in chunks for s in c) == sorted(id(s) for s in data)
        for c in chunks:
            nodes = B.pack_prefixes([s.token_ids for s in c]).input_ids.shape[1]
            assert nodes <= budget or len(c) == 1
    assert len(B.prefix_micro_batches(data, 10_000)) == 1


@pytest.mark.parametrize("path", ["sdpa", "eager", "plain"])
def test_packed_forward_equals_per_sample_forward(monkeypatch, path):
    model = small_model()
    if path == "plain":  # the model's own forward and logits, not the fused head
        monkeypatch.setattr(F, "_FUSED_HEAD_TYPES", set())
    else:
        model.config._attn_implementation = path
    data = grouped_samples(2)
    rows = B.collate(data, 0, "cpu")
    tree = B.collate(data, 0, "cpu", shared_prefix=True)
    assert tree.positions < rows.positions / 2
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
    allowed = B.pack_prefixes([[1, 2]]).allowed
    with pytest.raises(ValueError, match="trainer.shared_prefix=false"):
        F.tree_attention_mask(model, allowed)


def _lora(model: torch.nn.Module) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1)
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"])
    return get_peft_model(model, cfg)


def _train(model, preset: str, data, shared: bool, **overrides) -> list[dict[str, float]]:
    optim = OptimSection(lr=1e-2)
    algo = resolve_algorithm(preset, use_tis=True, **overrides)
    value_head = U.ValueHead(32) if algo.uses_value_head else None
    opt = make_optimizer(model, value_head, optim)
    ctx = U.UpdateContext(
        model=model, optimizer=opt, scheduler=make_scheduler(opt, optim, 4), algo=algo, pad_id=0,
        device=torch.device("cpu"), temperature=1.0, micro_batch_tokens=96, grad_clip=1.0,
        value_head=value_head, ref_model=small_model(seed=3) if algo.kl_coef else None,
        shared_prefix=shared,
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
