"""The sample ledger: trajectory results into the buffer and complete groups, batches out.

Every trajectory a job starts is accounted for, always: started = trained + dropped + filtered + failed + in
flight + buffered (`TrainingState.ledger_balanced`). A result whose trajectory is not in flight (a repeated
report) is ignored and counted; a failed one (infra) is masked out of training, never scored 0; a group is
complete once all its members reported, and batches are made of complete groups in completion order. Pure:
updates the `TrainingState` it is given.
"""

from __future__ import annotations

from rollart.contracts.activities import SampleRef
from rollart.contracts.rollouts import TrajectoryResult
from rollart.contracts.training import TrainingPlan, TrainingState
from rollart.workflows.training import admission, filtering, staleness

__all__ = ["accept", "batch_ready", "sample_of", "take_batch", "train_partial"]


def sample_of(r: TrajectoryResult) -> SampleRef:
    """What the trainer gets of a completed trajectory (its tokens stay in the store under `turn_keys`)."""
    return SampleRef(
        trajectory_id=r.trajectory_id,
        task=r.task,
        group_id=r.group_id,
        reward=r.reward or 0.0,
        success=bool(r.success),
        turn_keys=r.turn_keys,
        policy_version_min=r.policy_version_min or 0,
        policy_version_max=r.policy_version_max or 0,
        completion_tokens=r.completion_tokens,
        completion_index=r.completion_index,
        prompt_tokens=r.prompt_tokens,
        uncached_prompt_tokens=r.uncached_prompt_tokens,
    )


def accept(plan: TrainingPlan, state: TrainingState, results: list[TrajectoryResult]) -> int:
    """Take reported results into the ledger; how many were in flight (0: only repeats, no progress).

    A completed result is buffered, anything else counted as failed; a group whose last member reported is
    complete: ready for a batch, unless dynamic sampling filters it or every member failed (a ready group with
    no sample would let a stalled job "train" on an empty batch).
    """
    accepted = 0
    for r in results:
        running = state.in_flight.pop(r.trajectory_id, None)
        if running is None:
            state.duplicates_ignored += 1
            continue
        accepted += 1
        group = running.group
        state.restores += r.restores
        state.engine_moves += r.engine_moves
        buffered = r.status == "completed" and r.reward is not None and r.policy_version_min is not None
        if buffered:
            state.buffer.append(sample_of(r))
        else:
            state.failed += 1
        state.unfinished[group] -= 1
        if state.unfinished[group] == 0:
            del state.unfinished[group]
            # the last member buffered: trainable; else some other must have been (every member failed: nothing)
            trainable = buffered or any(x.group_id == group for x in reversed(state.buffer))
            if trainable and not filtering.filter_flat(plan, state, group):
                state.ready_groups.append(group)
    return accepted


def _fresh_ready(plan: TrainingPlan, state: TrainingState) -> set[str]:
    bound, oldest = plan.training.async_bound, staleness.oldest_versions(state)
    return {g for g in state.ready_groups if not staleness.is_stale(state, bound, g, oldest)}


def batch_ready(plan: TrainingPlan, state: TrainingState) -> bool:
    """A batch's worth of samples in complete groups that may still be trained on."""
    ready = _fresh_ready(plan, state)
    return sum(1 for x in state.buffer if x.group_id in ready) >= plan.training.batch_size


def train_partial(plan: TrainingPlan, state: TrainingState) -> bool:
    """A stalled job trains on a partial batch: nothing in flight, no room to launch, not paused, and some
    complete group that may be trained on (failures shrank the batch, and nothing else can happen)."""
    ready = bool(_fresh_ready(plan, state))
    return ready and not state.in_flight and not admission.can_launch(plan, state) and not state.paused


def take_batch(plan: TrainingPlan, state: TrainingState) -> list[SampleRef]:
    """Whole complete groups, oldest first, until the batch is full (or no group is left), out of the buffer: each
    group's members in buffer order (one pass over the buffer)."""
    members: dict[str, list[SampleRef]] = {}
    for x in state.buffer:
        members.setdefault(x.group_id, []).append(x)
    taken: list[str] = []
    size = 0
    while size < plan.training.batch_size and len(taken) < len(state.ready_groups):
        group = state.ready_groups[len(taken)]
        taken.append(group)
        size += len(members.get(group, []))
    state.ready_groups = state.ready_groups[len(taken) :]
    gone = set(taken)
    state.buffer = [x for x in state.buffer if x.group_id not in gone]
    return [x for g in taken for x in members.get(g, [])]
