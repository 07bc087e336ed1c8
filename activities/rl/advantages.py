"""GRPO advantages: each trajectory's reward relative to the other samples of its group.

Pure Python (no torch): the numbers are per trajectory, a few hundred at most,
and being torch-free keeps this importable anywhere (metrics, tests).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Sequence

__all__ = ["groups_with_signal", "grpo_advantages", "in_unsolved_group"]


def _groups(group_ids: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    """Indices of each group, in first-seen order."""
    groups: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(group_ids):
        groups[g].append(i)
    return groups


def grpo_advantages(
    rewards: Sequence[float],
    group_ids: Sequence[Hashable],
    *,
    normalize_std: bool = True,
    std_floor: float = 0.0,
    eps: float = 1e-6,
) -> list[float]:
    """A_i = (r_i − mean of i's group) / (max(population std of the group, std_floor) + eps).

    Why groups: samples of the same prompt are each other's baseline, so no
    value model is needed. A group of one member has no baseline, and a group
    whose rewards are all equal says nothing about which sample was better:
    both get advantage 0 (exactly, not eps-noise). `normalize_std=False` keeps
    the raw difference from the mean (Dr. GRPO), which avoids up-weighting
    groups that differ only by tiny reward noise. `std_floor` keeps the division for groups whose rewards
    really differ but stops it from blowing a tiny difference up to a full-size advantage: a group of members
    that all follow one route, where the one that strays scores a little less, would otherwise punish
    straying as hard failure.
    """
    if len(rewards) != len(group_ids):
        raise ValueError(f"got {len(rewards)} rewards but {len(group_ids)} group ids; pass one group id per reward")
    adv = [0.0] * len(rewards)
    for members in _groups(group_ids).values():
        if len(members) < 2:
            continue
        rs = [float(rewards[i]) for i in members]
        mean = sum(rs) / len(rs)
        std = math.sqrt(sum((r - mean) ** 2 for r in rs) / len(rs))
        if std == 0.0:
            continue
        scale = 1.0 / (max(std, std_floor) + eps) if normalize_std else 1.0
        for i, r in zip(members, rs):
            adv[i] = (r - mean) * scale
    return adv


def in_unsolved_group(successes: Sequence[bool], group_ids: Sequence[Hashable]) -> list[bool]:
    """For each sample, whether no member of its group succeeded (`trainer.loss.bonus_on: unsolved`).

    Why: an exploration bonus is needed where a task is not solved yet; on a group that succeeds it only
    pushes a working policy back towards uniform, with no advantage to hold it (all members scored alike)."""
    if len(successes) != len(group_ids):
        raise ValueError(f"got {len(successes)} success flags but {len(group_ids)} group ids")
    out = [False] * len(successes)
    for members in _groups(group_ids).values():
        unsolved = not any(successes[i] for i in members)
        for i in members:
            out[i] = unsolved
    return out


def groups_with_signal(advantages: Sequence[float], group_ids: Sequence[Hashable]) -> float:
    """Fraction of groups in which some sample has a non-zero advantage (0.0 for no groups).

    Why it matters: a group whose samples all got the same reward contributes
    no gradient. When this fraction falls towards 0 the policy has either
    solved the task or collapsed onto one answer (check entropy to tell which);
    either way training has stopped learning.
    """
    if len(advantages) != len(group_ids):
        raise ValueError(f"got {len(advantages)} advantages but {len(group_ids)} group ids")
    groups = _groups(group_ids)
    if not groups:
        return 0.0
    live = sum(1 for members in groups.values() if any(advantages[i] != 0.0 for i in members))
    return live / len(groups)
