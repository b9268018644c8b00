"""From scored episodes to training tensors: samples with group advantages, micro-batches, padding.

Micro-batching and padding take any `Tokens` (ids and a loss mask), so SFT shares them. Scoring
the tokens with the model is `looprl.models.forward.forward_logprobs`. With shared prefixes
(`prefix_micro_batches`, `pack_prefixes`) a micro-batch's samples are also laid out as one prefix
tree, so a group's prompt and every common earlier turn is forwarded once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

import torch

from looprl.algorithms.objective import group_advantages
from looprl.algorithms.presets import AlgorithmConfig
from looprl.algorithms.staleness import staleness_stats, token_lags, within_bound
from looprl.models.forward import Packed
from looprl.types import EpisodeResult, Trajectory


@dataclass
class Sample:
    """One training sequence (an episode segment) with its sequence-level advantage.

    `sampler_logprobs` are each token's behaviour logprobs, as its sampler recorded them;
    `versions` the policy version that sampled each token (-1 where mask is 0, or unknown; empty:
    not tracked), as `sample_versions` reads them off the episode.
    """

    token_ids: list[int]
    mask: list[int]
    sampler_logprobs: list[float]
    advantage: float
    reward: float
    versions: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class StalenessBound:
    """Which tokens an update may train on: those sampled at most `max_staleness` versions
    before `trained_version`, the version of the weights the update starts from."""

    trained_version: int
    max_staleness: int

    def lags(self, versions: list[int]) -> torch.Tensor:
        """Each token's lag behind `trained_version` (`looprl.algorithms.staleness`): (T,)."""
        return token_lags(torch.tensor(versions, dtype=torch.long), self.trained_version)

    def all_stale(self, ep: EpisodeResult) -> bool:
        """Whether every sampled token of `ep` lags more than `max_staleness` (it is dropped)."""
        kept = 0.0
        for seg in ep.trajectories:
            mask = torch.tensor(seg.mask, dtype=torch.float32)  # (T,)
            lags = self.lags(sample_versions(seg, ep))  # (T,)
            kept += float(within_bound(lags, mask, self.max_staleness).sum())
        return kept == 0 and any(seg.num_sampled for seg in ep.trajectories)


def sample_versions(seg: Trajectory, ep: EpisodeResult) -> list[int]:
    """Each token's sampling version: the segment's own, where it has none (data written before
    per-token versions, an engine that named none) the episode's `policy_version`; -1 off the mask."""
    episode = -1 if ep.policy_version is None else ep.policy_version
    versions = seg.versions or [-1] * len(seg.token_ids)
    return [(episode if v < 0 else v) if m else -1 for m, v in zip(seg.mask, versions, strict=True)]


def samples_from_groups(
    groups: list[list[EpisodeResult]],
    algo: AlgorithmConfig,
    max_len: int,
    bound: StalenessBound | None = None,
) -> tuple[list[Sample], dict[str, float]]:
    """Samples from every trainable episode, with advantages computed within its group.

    The math is `looprl.algorithms.group_advantages`, called once per group size.

    Episodes with rollout or scoring errors are left out (and do not enter the group's
    baseline); groups with fewer than two trainable episodes give no samples. Groups that lost
    episodes are scored on their own, the complete ones together (batch whitening sees those).
    For the token-level GAE estimator (PPO) the advantage here is 0; the update computes it
    from the value head. `max_len` is the per-episode generation budget for overlong shaping.

    With `bound`, an episode whose sampled tokens all lag more than `bound.max_staleness` is left
    out like an errored one (`async/episodes_too_stale`, its tokens in `async/tokens_too_stale`),
    and the other samples' too-stale tokens are masked out of the loss (`bound_staleness`).
    """
    usable = [[ep for ep in g if ep.trainable] for g in groups]
    stale = [ep for g in usable for ep in g if bound is not None and bound.all_stale(ep)]
    usable = [[ep for ep in g if all(ep is not x for x in stale)] for g in usable]
    usable = [g for g in usable if len(g) >= 2]
    by_size: dict[int, list[list[EpisodeResult]]] = {}
    for g in usable:
        by_size.setdefault(len(g), []).append(g)
    samples: list[Sample] = []
    stats: dict[str, float] = {
        "groups_used": float(len(usable)),
        "zero_var_frac": 0.0,
        "keep_frac": 0.0,
        **alike_split(usable),
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
                            Sample(
                                seg.token_ids, seg.mask, seg.logprobs, float(adv[n, k]), reward,
                                versions=sample_versions(seg, ep),
                            )
                        )  # fmt: skip
    if bound is None:
        return samples, stats
    samples, async_stats = bound_staleness(samples, bound)
    async_stats["async/episodes_too_stale"] = float(len(stale))
    async_stats["async/tokens_too_stale"] += float(
        sum(seg.num_sampled for ep in stale for seg in ep.trajectories)
    )
    return samples, {**stats, **async_stats}


def bound_staleness(
    samples: list[Sample], bound: StalenessBound
) -> tuple[list[Sample], dict[str, float]]:
    """The samples with their too-stale tokens masked out (a sample left with none is dropped),
    and the staleness of their sampled tokens: `async/staleness_mean`, `_max`, `_frac_lag<b>`
    (`looprl.algorithms.staleness.staleness_stats`) and `async/tokens_too_stale`.

    A sample with nothing masked is kept as it is, so a batch within the bound trains exactly as
    without one.
    """
    kept: list[Sample] = []
    lags, masks = [], []
    too_stale = 0.0
    for s in samples:
        lag = bound.lags(s.versions or [-1] * len(s.token_ids))  # (T,), unknown: lag 0
        mask = torch.tensor(s.mask, dtype=torch.float32)  # (T,)
        within = within_bound(lag, mask, bound.max_staleness)  # (T,)
        dropped = float(mask.sum() - within.sum())
        too_stale += dropped
        lags.append(lag)
        masks.append(mask)
        if not dropped:
            kept.append(s)
        elif within.sum() > 0:
            kept.append(replace(s, mask=[int(x) for x in within.tolist()]))
    stats = staleness_stats(torch.cat(lags), torch.cat(masks)) if samples else {}
    out = {f"async/{key}": value for key, value in stats.items()}
    return kept, {**out, "async/tokens_too_stale": too_stale}


SOLVED = 1.0
"""The reward at which an episode counts as solved: pass@k's threshold (`looprl.eval.summary`)."""


def alike_split(groups: list[list[EpisodeResult]]) -> dict[str, float]:
    """Of `groups`, the fractions whose rewards were all equal and solved (>= `SOLVED`) or not.

    The two need different fixes: all solved, harder tasks; none solved, easier tasks, larger
    groups or a warm start. Together they are the zero-variance fraction.
    """
    alike = [g[0].reward for g in groups if len({ep.reward for ep in g}) == 1]
    n = max(1, len(groups))
    return {
        "all_correct_frac": sum(r >= SOLVED for r in alike) / n,
        "all_wrong_frac": sum(r < SOLVED for r in alike) / n,
    }


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


def _common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def prefix_rows(seqs: Sequence[list[int]], row_tokens: int) -> list[tuple[list[int], int]]:
    """The sequences (by index) of each prefix-tree row, with the row's node count.

    Sorting the token lists lexicographically puts sequences that share a prefix side by side,
    and a sequence's longest prefix shared with any earlier one in its row is the one it shares
    with its predecessor, so it adds len - that many nodes. A row holds at most `row_tokens`
    nodes (attention within a row costs its length squared); a longer sequence gets its own row.
    """
    rows: list[tuple[list[int], int]] = []
    members: list[int] = []
    nodes = 0
    for i in sorted(range(len(seqs)), key=lambda i: seqs[i]):
        new = len(seqs[i]) - (_common_prefix(seqs[members[-1]], seqs[i]) if members else 0)
        if members and nodes + new > row_tokens:
            rows.append((members, nodes))
            members, nodes, new = [], 0, len(seqs[i])
        members.append(i)
        nodes += new
    if members:
        rows.append((members, nodes))
    return rows


def prefix_micro_batches(
    samples: Sequence[SeqT], token_budget: int, row_tokens: int
) -> list[list[SeqT]]:
    """Split sequences into micro-batches of whole prefix-tree rows (`prefix_rows`), in order.

    A micro-batch's rows are padded to its longest, and rows x longest stays in `token_budget`
    (a row longer than the budget gets a micro-batch of its own), so `pack_prefixes` on one
    micro-batch rebuilds exactly its rows.
    """
    batches: list[list[SeqT]] = []
    current: list[SeqT] = []
    n_rows = longest = 0
    for members, nodes in prefix_rows([s.token_ids for s in samples], row_tokens):
        if current and (n_rows + 1) * max(longest, nodes) > token_budget:
            batches.append(current)
            current, n_rows, longest = [], 0, 0
        current += [samples[i] for i in members]
        n_rows, longest = n_rows + 1, max(longest, nodes)
    if current:
        batches.append(current)
    return batches


def _prefix_tree(
    seqs: Sequence[list[int]], members: list[int], paths: list[list[int]], offset: int
) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """One row's (node tokens, node depths, (sequence, nodes it shares) in order).

    `members` are in lexicographic order; each adds the nodes past the prefix it shares with its
    predecessor, its longest prefix shared with any earlier member. Fills `paths[i]` with member
    i's flat node ids, `offset` being the row's first.
    """
    tokens: list[int] = []
    depth: list[int] = []
    added: list[tuple[int, int]] = []
    prev_seq: list[int] = []
    prev_path: list[int] = []
    for i in members:
        seq = seqs[i]
        shared = _common_prefix(prev_seq, seq)
        start = offset + len(tokens)
        tokens.extend(seq[shared:])
        depth.extend(range(shared, len(seq)))
        paths[i] = prev_path[:shared] + list(range(start, offset + len(tokens)))
        added.append((i, shared))
        prev_seq, prev_path = seq, paths[i]
    return tokens, depth, added


def pack_prefixes(seqs: Sequence[list[int]], row_tokens: int) -> Packed:
    """The prefix trees of `seqs` as packed rows (`looprl.models.forward.Packed`), on the CPU.

    Rows are `prefix_rows`; in a row, nodes are laid out in depth-first order (`_prefix_tree`),
    so a node's ancestors precede it, and node j may attend node i when i lies on j's path from
    the root. Rows are right-padded to the longest (a padding node attends to itself alone and
    nothing reads it); `node_index` (B, T) gives each sequence's token t its node in R * L.
    """
    rows = prefix_rows(seqs, row_tokens)
    width = max(nodes for _, nodes in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)  # (R, L)
    pos = torch.zeros((len(rows), width), dtype=torch.long)  # (R, L)
    allowed = torch.eye(width, dtype=torch.bool).repeat(len(rows), 1, 1)  # (R, L, L)
    paths: list[list[int]] = [[] for _ in seqs]
    for r, (members, nodes) in enumerate(rows):
        tokens, depth, added = _prefix_tree(seqs, members, paths, r * width)
        ids[r, :nodes], pos[r, :nodes] = torch.tensor(tokens), torch.tensor(depth)
        for i, shared in added:
            path = torch.tensor(paths[i], dtype=torch.long) - r * width  # (T_i,) in the row
            below = torch.ones((len(path), len(path)), dtype=torch.bool).tril()[shared:]
            allowed[r, path[shared:, None], path[None, :]] = below  # new nodes see their path
    node_index = torch.zeros((len(seqs), max(len(s) for s in seqs)), dtype=torch.long)  # (B, T)
    for i, path_i in enumerate(paths):
        node_index[i, : len(path_i)] = torch.tensor(path_i, dtype=torch.long)
    return Packed(ids, pos, allowed[:, None], node_index)  # allowed (R, 1, L, L)


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
    packed: Packed | None = None  # the samples as one prefix tree, forwarded instead of input_ids
    versions: torch.Tensor | None = None  # (B, T-1) sampling version per target, -1: off/unknown

    @property
    def positions(self) -> int:
        """Positions a forward of this micro-batch computes (a shared prefix once per row)."""
        if self.packed is not None:  # every tree node lies on a sample's path; padding on none
            return int(self.packed.node_index[self.attention_mask > 0].unique().numel())
        return int(self.attention_mask.sum())


def collate(
    samples: list[Sample], pad_id: int, device: torch.device | str, *, row_tokens: int = 0
) -> Batch:
    """Right-pad a micro-batch (`pad_right`) into tensors on `device`.

    With `row_tokens` > 0 the batch also carries the samples' prefix trees in rows of at most
    that many nodes (`pack_prefixes`), which the forward runs instead of the padded samples.
    """
    packed = None
    if row_tokens > 0:
        tree = pack_prefixes([s.token_ids for s in samples], row_tokens)
        packed = Packed(*(t.to(device) for t in tree))
    ids, attn, mask = pad_right(samples, pad_id)  # (B, T) each
    b, t_max = ids.shape
    lps = torch.zeros((b, t_max), dtype=torch.float32)  # (B, T)
    versions = torch.full((b, t_max), -1, dtype=torch.long)  # (B, T)
    for i, s in enumerate(samples):
        lps[i, : len(s.token_ids)] = torch.tensor(s.sampler_logprobs, dtype=torch.float32)
        if s.versions:
            versions[i, : len(s.token_ids)] = torch.tensor(s.versions, dtype=torch.long)
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
        packed=packed,
        versions=versions[:, 1:].to(device),  # (B, T-1)
    )
