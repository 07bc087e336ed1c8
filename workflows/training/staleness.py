"""The async bound: a complete group may be trained on at step k only while k − (the oldest policy version any
of its members used) ≤ `training.async_bound`. Versions only grow, so a group that is too old now stays too old:
it is dropped and counted. Pure: functions of the `TrainingState`.
"""

from __future__ import annotations

from rollart.contracts.training import TrainingState

__all__ = ["drop_stale", "is_stale", "stale_ready"]


def is_stale(state: TrainingState, bound: int, group_id: str) -> bool:
    """A buffered member of the group is more than `bound` versions behind the current step."""
    return any(state.step - x.policy_version_min > bound for x in state.buffer if x.group_id == group_id)


def stale_ready(state: TrainingState, bound: int) -> bool:
    """Some complete group waits that can never be trained on (the loop must wake up to drop it)."""
    return any(is_stale(state, bound, g) for g in state.ready_groups)


def drop_stale(state: TrainingState, bound: int) -> int:
    """Drop the complete groups too old for the current step from the buffer and count them; how many members."""
    dropped = 0
    for group in [g for g in state.ready_groups if is_stale(state, bound, g)]:
        members = [x for x in state.buffer if x.group_id == group]
        dropped += len(members)
        state.buffer = [x for x in state.buffer if x.group_id != group]
        state.ready_groups.remove(group)
    state.dropped += dropped
    return dropped
