"""Presets, `resolve_algorithm` errors, `group_advantages` and `policy_objective`."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch.testing import assert_close

from looprl.algorithms import (
    PRESETS,
    AlgorithmConfig,
    batch_normalizer,
    broadcast_to_tokens,
    group_advantages,
    policy_objective,
    resolve_algorithm,
)


def t(x: list) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def grad(x: torch.Tensor) -> torch.Tensor:
    assert x.grad is not None, "no gradient reached this tensor"
    return x.grad


def test_preset_names_and_key_defaults() -> None:
    assert set(PRESETS) == {
        "grpo",
        "dr_grpo",
        "dapo",
        "gspo",
        "cispo",
        "rloo",
        "reinforce_pp",
        "ppo",
    }
    assert (PRESETS["dapo"].eps_low, PRESETS["dapo"].eps_high) == (0.2, 0.28)
    assert (PRESETS["gspo"].eps_low, PRESETS["gspo"].eps_high) == (3e-4, 4e-4)
    assert PRESETS["dr_grpo"].aggregation == "constant_normalizer"
    assert PRESETS["ppo"].uses_value_head and not PRESETS["grpo"].uses_value_head
    assert all(p.kl_coef == 0.0 and p.name == name for name, p in PRESETS.items())


def test_resolve_unknown_preset() -> None:
    with pytest.raises(ValueError, match=r"unknown preset 'x'; choose one of \['cispo', 'dapo'"):
        resolve_algorithm("x")


def test_resolve_overrides_and_unknown_field() -> None:
    cfg = resolve_algorithm("grpo", kl_coef=0.04, eps_high=0.28)
    assert (cfg.kl_coef, cfg.eps_high, cfg.name) == (0.04, 0.28, "grpo")
    assert PRESETS["grpo"].kl_coef == 0.0  # presets are not mutated
    with pytest.raises(ValueError, match=r"unknown algorithm field\(s\) \['kl_cof'\]"):
        resolve_algorithm("grpo", kl_cof=0.1)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("advantage", "gpro", "unknown advantage 'gpro'; choose one of"),
        ("policy_loss", "ppo", "unknown policy loss 'ppo'; choose one of"),
        ("aggregation", "mean", "unknown aggregation 'mean'; choose one of"),
        ("kl_estimator", "k2", "unknown KL estimator 'k2'; choose one of"),
        ("eps_low", -0.1, "eps_low must be >= 0"),
        ("tis_cap", 0.0, "tis_cap must be > 0"),
        ("gamma", 1.5, r"gamma must be in \[0, 1\]"),
        ("overlong_buffer_frac", 1.0, "overlong_buffer_frac must be in"),
        ("max_len", 0, "max_len must be a positive"),
    ],
)
def test_invalid_config_fails_at_construction(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_algorithm("grpo", **{field: value})


def test_group_advantages_dapo_shaping_and_dynamic_sampling() -> None:
    cfg = resolve_algorithm("dapo")
    rewards = t([[1, 1], [1, 0]])
    lengths = torch.tensor([[10, 20], [5, 18]])  # max_len 20, buffer 0.2 * 20 = 4 tokens
    out = group_advantages(cfg, rewards, lengths=lengths, max_len=20)
    assert_close(out.rewards, t([[1, 0], [1, -0.5]]))
    assert out.keep.tolist() == [[False, False], [True, True]]  # group 0 has equal raw rewards
    a = 1 / math.sqrt(2)  # (x - mean) / unbiased std for a pair is +-1/sqrt(2)
    assert out.advantages is not None
    assert_close(out.advantages, t([[a, -a], [a, -a]]), atol=1e-5, rtol=0)
    assert out.stats["zero_variance_group_frac"] == 0.5 and out.stats["keep_frac"] == 0.5
    with pytest.raises(ValueError, match="needs lengths= and max_len="):
        group_advantages(cfg, rewards)


def test_group_advantages_overlong_masking_and_gae() -> None:
    cfg = resolve_algorithm("grpo", overlong_masking=True)
    truncated = torch.tensor([[True, False], [False, False]])
    out = group_advantages(cfg, t([[1, 0], [0, 1]]), truncated=truncated)
    assert out.keep.tolist() == [[False, True], [True, True]]
    assert group_advantages(resolve_algorithm("ppo"), t([[1, 0]])).advantages is None


def _inputs(seed: int, b: int = 4, tl: int = 6) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(b, tl, generator=g) > 0.3).float()
    mask[0] = 0.0
    mask[0, :2] = 1.0
    old = -torch.rand(b, tl, generator=g) * 3
    return {
        "logprobs": (old + 0.1 * torch.randn(b, tl, generator=g)).requires_grad_(True),
        "old_logprobs": old,
        "sampler_logprobs": old + 0.05 * torch.randn(b, tl, generator=g),
        "advantages": broadcast_to_tokens(torch.randn(b, generator=g), mask),
        "mask": mask,
        "ref_logprobs": old + 0.2 * torch.randn(b, tl, generator=g),
        "entropy": torch.rand(b, tl, generator=g).requires_grad_(True),
        "values": torch.randn(b, tl, generator=g).requires_grad_(True),
        "old_values": torch.randn(b, tl, generator=g),
        "returns": torch.randn(b, tl, generator=g),
    }


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_gives_finite_loss_and_gradient(name: str) -> None:
    cfg = resolve_algorithm(name, kl_coef=0.1, entropy_coef=0.01)
    x = _inputs(0)
    if not cfg.uses_value_head:  # values train a value head whenever they are passed
        for k in ("values", "old_values", "returns"):
            del x[k]
    loss, stats = policy_objective(cfg, **x)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert torch.isfinite(grad(x["logprobs"])).all() and grad(x["logprobs"]).abs().sum() > 0
    assert grad(x["entropy"]).abs().sum() > 0
    assert all(math.isfinite(v) for v in stats.values())
    assert {"loss", "pg_loss", "kl", "entropy", "clip_frac", "ratio_mean", "tis_weight_mean",
            "mismatch_kl"} <= set(stats)  # fmt: skip
    assert ("value_loss" in stats) == (name == "ppo")
    if name == "ppo":
        assert grad(x["values"]).abs().sum() > 0


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_zero_advantage_gives_zero_policy_gradient(name: str) -> None:
    x = _inputs(1)
    x["advantages"] = torch.zeros_like(x["mask"])
    loss, _ = policy_objective(PRESETS[name], **x)
    loss.backward()
    assert_close(grad(x["logprobs"]), torch.zeros_like(x["mask"]))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_micro_batch_accumulation_equals_full_batch(name: str) -> None:
    cfg = resolve_algorithm(name, kl_coef=0.05, entropy_coef=0.01)
    x = _inputs(2, b=6)
    norm = batch_normalizer(cfg.aggregation, [x["mask"]], max_len=cfg.max_len)
    full, _ = policy_objective(cfg, **x, normalizer=norm)
    full.backward()
    grads = {k: grad(x[k]).clone() for k in ("logprobs", "entropy", "values")}
    for k in grads:
        x[k].grad = None
    parts = [slice(0, 1), slice(1, 4), slice(4, 6)]
    norm = batch_normalizer(cfg.aggregation, [x["mask"][p] for p in parts], max_len=cfg.max_len)
    total = 0.0
    for p in parts:
        loss, _ = policy_objective(cfg, **{k: v[p] for k, v in x.items()}, normalizer=norm)
        loss.backward()
        total += float(loss.detach())
    assert total == pytest.approx(float(full.detach()), abs=1e-6)
    for k, expected in grads.items():
        assert_close(grad(x[k]), expected)


def test_tis_weights_the_policy_loss() -> None:
    cfg = resolve_algorithm("rloo")  # reinforce loss, token_mean
    logprobs = t([[-1.0, -1.0]]).requires_grad_(True)
    args: dict[str, Any] = {"logprobs": logprobs, "old_logprobs": t([[-1.0, -1.0]]), "advantages": t([[1, 1]]),
            "sampler_logprobs": t([[-1.5, -3.0]]), "mask": t([[1, 1]])}  # fmt: skip
    loss, stats = policy_objective(cfg, **args)
    w = [math.exp(0.5), 2.0]  # the second weight e^2 is capped at 2
    assert float(loss.detach()) == pytest.approx(sum(w) / 2, rel=1e-6)
    assert stats["tis_weight_mean"] == pytest.approx(sum(w) / 2, rel=1e-6)
    assert stats["tis_clip_frac"] == 0.5
    assert stats["mismatch_kl"] == pytest.approx(
        (math.exp(0.5) - 1.5 + math.exp(2) - 3) / 2, rel=1e-5
    )
    assert stats["logprob_gap"] == pytest.approx((0.5 + 2.0) / 2)  # mean |old - sampler|
    loss_off, stats_off = policy_objective(resolve_algorithm("rloo", use_tis=False), **args)
    assert float(loss_off.detach()) == pytest.approx(1.0) and "tis_weight_mean" not in stats_off


def test_kl_entropy_and_value_terms() -> None:
    base: dict[str, Any] = {"logprobs": t([[-1.0, -2.0]]), "old_logprobs": t([[-1.0, -2.0]]),
            "sampler_logprobs": t([[-1.0, -2.0]]), "advantages": t([[0, 0]]), "mask": t([[1, 1]])}  # fmt: skip
    ref = t([[-1.5, -1.0]])
    k3 = ((math.exp(-0.5) - 0.5) + (math.e - 2.0)) / 2
    loss, stats = policy_objective(resolve_algorithm("dapo", kl_coef=0.1), **base, ref_logprobs=ref)
    assert float(loss.detach()) == pytest.approx(0.1 * k3) and stats["kl"] == pytest.approx(k3)
    with pytest.raises(ValueError, match="kl_coef > 0 needs ref_logprobs"):
        policy_objective(resolve_algorithm("dapo", kl_coef=0.1), **base)
    loss, stats = policy_objective(
        resolve_algorithm("dapo", entropy_coef=0.5), **base, entropy=t([[2.0, 4.0]])
    )
    assert float(loss.detach()) == pytest.approx(-0.5 * 3.0) and stats["entropy"] == 3.0
    with pytest.raises(ValueError, match="trains a value head"):
        policy_objective(resolve_algorithm("ppo"), **base)
    values = {"values": t([[1.0, 0.5]]), "old_values": t([[1.0, 0.5]]), "returns": t([[2.0, 0.5]])}
    loss, stats = policy_objective(resolve_algorithm("ppo"), **{**base, **values})
    value_coef, token_mean_of_half_sq_err = 0.5, (0.5 * 1.0 + 0.0) / 2
    assert float(loss.detach()) == pytest.approx(value_coef * token_mean_of_half_sq_err)
    with pytest.raises(ValueError, match="broadcast_to_tokens"):
        policy_objective(resolve_algorithm("grpo"), **{**base, "advantages": t([1.0])})


def test_config_is_frozen() -> None:
    cfg = AlgorithmConfig()
    with pytest.raises(AttributeError):
        cfg.kl_coef = 1.0  # type: ignore[misc]


def test_algorithms_layer_imports_only_torch_types_and_stdlib() -> None:
    import ast
    import sys
    from pathlib import Path

    import looprl.algorithms

    allowed = {"torch", "looprl.types", "looprl.algorithms"}
    for path in Path(looprl.algorithms.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                ok = name.split(".")[0] in sys.stdlib_module_names or any(
                    name == a or name.startswith(a + ".") for a in allowed
                )
                assert ok, (
                    f"{path.name} imports {name}: the algorithms layer may use torch and types only"
                )
