"""The async bound: a complete group may be trained on at step k only while k − (the oldest policy version any
of its members used) ≤ `training.async_bound`. Versions only grow, so a group that is too old now stays too old:
it is dropped and counted. Each answer takes one pass over the buffer (`oldest_versions`), not one per complete
group: at 10,000 trajectories in flight that is the difference between a wake-up's O(buffer) and O(groups x
buffer). Pure: functions of the `TrainingState`.
"""

from __future__ import annotations

from rollart.contracts.training import TrainingState

__all__ = ["drop_stale", "is_stale", "oldest_versions", "stale_groups", "stale_ready"]


def oldest_versions(state: TrainingState) -> dict[str, int]:
    """Each group with buffered members: the oldest policy version any of them used (one pass over the buffer)."""
    oldest: dict[str, int] = {}
    for x in state.buffer:
        v = oldest.get(x.group_id)
        if v is None or x.policy_version_min < v:
            oldest[x.group_id] = x.policy_version_min
    return oldest


def is_stale(state: TrainingState, bound: int, group_id: str, oldest: dict[str, int] | None = None) -> bool:
    """A buffered member of the group is more than `bound` versions behind the current step (`oldest`: the
    buffer's `oldest_versions`, when the caller has them)."""
    v = (oldest if oldest is not None else oldest_versions(state)).get(group_id)
    return v is not None and state.step - v > bound


def stale_groups(state: TrainingState, bound: int) -> list[str]:
    """The complete groups too old for the current step, in completion order."""
    oldest = oldest_versions(state)
    return [g for g in state.ready_groups if is_stale(state, bound, g, oldest)]


def stale_ready(state: TrainingState, bound: int) -> bool:
    """Some complete group waits that can never be trained on (the loop must wake up to drop it)."""
    return bool(state.ready_groups) and bool(stale_groups(state, bound))


def drop_stale(state: TrainingState, bound: int) -> int:
    """Drop the complete groups too old for the current step from the buffer and count them; how many members."""
    stale = set(stale_groups(state, bound))
    if not stale:
        return 0
    kept = [x for x in state.buffer if x.group_id not in stale]
    dropped = len(state.buffer) - len(kept)
    state.buffer = kept
    state.ready_groups = [g for g in state.ready_groups if g not in stale]
    state.dropped += dropped
    return dropped
