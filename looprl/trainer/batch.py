"""From scored episodes to training tensors: samples with group advantages, micro-batches, padding.

Micro-batching and padding take any `Tokens` (ids and a loss mask), so SFT shares them. Scoring
the tokens with the model is `looprl.models.forward.forward_logprobs`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch

from looprl.algorithms.objective import group_advantages
from looprl.algorithms.presets import AlgorithmConfig
from looprl.types import EpisodeResult


@dataclass
class Sample:
    """One training sequence (an episode segment) with its sequence-level advantage."""

    token_ids: list[int]
    mask: list[int]
    sampler_logprobs: list[float]
    advantage: float
    reward: float


def samples_from_groups(
    groups: list[list[EpisodeResult]], algo: AlgorithmConfig, max_len: int
) -> tuple[list[Sample], dict[str, float]]:
    """Samples from every trainable episode, with advantages computed within its group.

    The math is `looprl.algorithms.group_advantages`, called once per group size.

    Episodes with rollout or scoring errors are left out (and do not enter the group's
    baseline); groups with fewer than two trainable episodes give no samples. Groups that lost
    episodes are scored on their own, the complete ones together (batch whitening sees those).
    For the token-level GAE estimator (PPO) the advantage here is 0; the update computes it
    from the value head. `max_len` is the per-episode generation budget for overlong shaping.
    """
    usable = [[ep for ep in g if ep.trainable] for g in groups]
    usable = [g for g in usable if len(g) >= 2]
    by_size: dict[int, list[list[EpisodeResult]]] = {}
    for g in usable:
        by_size.setdefault(len(g), []).append(g)
    samples: list[Sample] = []
    stats: dict[str, float] = {
        "groups_used": float(len(usable)),
        "zero_var_frac": 0.0,
        "keep_frac": 0.0,
    }
    for _size, same in sorted(by_size.items()):
        rewards = torch.tensor(
            [[ep.reward for ep in g] for g in same], dtype=torch.float32
        )  # (N, G)
        lengths = torch.tensor(
            [[ep.num_generated_tokens for ep in g] for g in same], dtype=torch.float32
        )
        truncated = torch.tensor([[ep.truncated for ep in g] for g in same])
        res = group_advantages(algo, rewards, lengths=lengths, truncated=truncated, max_len=max_len)
        weight = len(same) / max(1, len(usable))
        stats["zero_var_frac"] += res.stats["zero_variance_group_frac"] * weight
        stats["keep_frac"] += res.stats["keep_frac"] * weight
        adv = res.advantages if res.advantages is not None else torch.zeros_like(rewards)
        for n, g in enumerate(same):
            for k, ep in enumerate(g):
                if not bool(res.keep[n, k]):
                    continue
                for seg in ep.trajectories:
                    if seg.num_sampled:
                        reward = float(res.rewards[n, k])
                        samples.append(
                            Sample(seg.token_ids, seg.mask, seg.logprobs, float(adv[n, k]), reward)
                        )
    return samples, stats


class Tokens(Protocol):
    """A sequence to train on: its token ids and loss mask (1 on trained tokens), of one length.

    `Sample` (RL) and `looprl.sft.train.SFTExample` (SFT) are both; micro-batching and padding
    below take either.
    """

    token_ids: list[int]
    mask: list[int]


SeqT = TypeVar("SeqT", bound=Tokens)


def micro_batches(samples: Sequence[SeqT], token_budget: int) -> list[list[SeqT]]:
    """Split sequences, shortest first, into micro-batches whose padded size stays in the budget.

    Sorting by length (stable: equal lengths keep their order) puts similar lengths together,
    so they pad less. A sequence longer than the budget gets a micro-batch of its own.
    """
    batches: list[list[SeqT]] = []
    current: list[SeqT] = []
    longest = 0
    for s in sorted(samples, key=lambda s: len(s.token_ids)):
        n = len(s.token_ids)
        if current and max(longest, n) * (len(current) + 1) > token_budget:
            batches.append(current)
            current, longest = [], 0
        current.append(s)
        longest = max(longest, n)
    if current:
        batches.append(current)
    return batches


def pad_right(
    seqs: Sequence[Tokens], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input ids, attention mask, float loss mask), each (B, T), right-padded to the longest.

    Padded positions get `pad_id`, attention 0 and loss mask 0, so they change no real
    position's output (the model is causal) and no loss.
    """
    t_max = max(len(s.token_ids) for s in seqs)
    ids = torch.full((len(seqs), t_max), pad_id, dtype=torch.long)  # (B, T)
    attn = torch.zeros((len(seqs), t_max), dtype=torch.long)  # (B, T)
    mask = torch.zeros((len(seqs), t_max), dtype=torch.float32)  # (B, T)
    for i, s in enumerate(seqs):
        n = len(s.token_ids)
        ids[i, :n] = torch.tensor(s.token_ids)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(s.mask, dtype=torch.float32)
    return ids, attn, mask


@dataclass
class Batch:
    """Padded tensors of one micro-batch, already shifted for next-token prediction.

    `input_ids`/`attention_mask` are (B, T); the rest are (B, T-1) and describe the target
    tokens `input_ids[:, 1:]`.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    targets: torch.Tensor
    loss_mask: torch.Tensor
    sampler_logprobs: torch.Tensor
    advantages: torch.Tensor
    rewards: torch.Tensor


def collate(samples: list[Sample], pad_id: int, device: torch.device | str) -> Batch:
    """Right-pad a micro-batch (`pad_right`) into tensors on `device`."""
    ids, attn, mask = pad_right(samples, pad_id)  # (B, T) each
    b, t_max = ids.shape
    lps = torch.zeros((b, t_max), dtype=torch.float32)
    for i, s in enumerate(samples):
        lps[i, : len(s.token_ids)] = torch.tensor(s.sampler_logprobs, dtype=torch.float32)
    adv = torch.tensor([s.advantage for s in samples], dtype=torch.float32)[:, None].expand(
        b, t_max - 1
    )
    return Batch(
        input_ids=ids.to(device),
        attention_mask=attn.to(device),
        targets=ids[:, 1:].to(device),  # (B, T-1)
        loss_mask=mask[:, 1:].to(device),  # (B, T-1)
        sampler_logprobs=lps[:, 1:].to(device),  # (B, T-1)
        advantages=adv.contiguous().to(device),  # (B, T-1)
        rewards=torch.tensor([s.reward for s in samples], dtype=torch.float32, device=device),
    )
