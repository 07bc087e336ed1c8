"""Dynamic sampling (`training.dynamic_sampling`, DAPO's filter with refill): a complete group whose rewards are
all equal gives GRPO no gradient, so it is left out as it completes and counted, and its slots free at once.

Unless so many were left out since the last step that the job would stop moving (a policy that solves or fails
everything): then groups are kept until the next step. A group of one is never filtered: it is its own baseline,
GRPO never gave it a signal to filter on. Pure: updates the `TrainingState` it is given.
"""

from __future__ import annotations

from rollart.contracts.training import TrainingPlan, TrainingState

__all__ = ["FLAT", "filter_flat"]

FLAT = 1e-9
"""Rewards closer than this are equal."""


def filter_flat(plan: TrainingPlan, state: TrainingState, group_id: str) -> bool:
    """Leave the complete group out of the buffer when it has no signal (counted as filtered); whether it was."""
    ds = plan.training.dynamic_sampling
    if not ds.enabled:  # before the buffer's scan: it runs for every group that completes
        return False
    members = [x for x in state.buffer if x.group_id == group_id]
    if not members:
        return False
    if next(t.group_size for t in plan.tasks if t.name == members[0].task) < 2:
        return False
    rewards = [x.reward for x in members]
    if max(rewards) - min(rewards) > FLAT:
        return False
    if state.filtered_since_step >= ds.max_filtered_batches * plan.training.batch_size:
        return False
    state.buffer = [x for x in state.buffer if x.group_id != group_id]
    state.filtered += len(members)
    state.filtered_since_step += len(members)
    state.filtered_successes_since_step += sum(x.success for x in members)
    return True
