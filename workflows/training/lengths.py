"""Each task's recent trajectory length in turns: the prior of `engine.priority: predicted`.

A group's members predict one another once one finishes (workflows/driver/free_members.py); before that, a
trajectory is predicted to run as long as its task's recent trajectories did, an exponential moving average
of their turns. Kept only under `predicted`. Pure: it updates the `TrainingState` it is given.
"""

from __future__ import annotations

from collections.abc import Iterable

from rollart.contracts.rollouts import TrajectoryResult
from rollart.contracts.training import TrainingPlan, TrainingState

__all__ = ["ALPHA", "observe", "predicted"]

ALPHA = 0.1
"""Each finished trajectory's weight in its task's mean (about the last 10 count)."""


def observe(plan: TrainingPlan, state: TrainingState, results: Iterable[TrajectoryResult]) -> None:
    """Fold the completed trajectories' turns into their tasks' means (call it before the ledger takes them: a
    repeated report, of a trajectory no longer in flight, is not counted twice)."""
    if plan.priority != "predicted":
        return
    for r in results:
        if r.status != "completed" or r.trajectory_id not in state.in_flight:
            continue
        mean = state.task_turns.get(r.task)
        state.task_turns[r.task] = float(r.turns) if mean is None else mean + ALPHA * (r.turns - mean)


def predicted(plan: TrainingPlan, state: TrainingState, task: str) -> float | None:
    """The predicted length of a trajectory of `task` launched now; None when not predicting or not yet known."""
    if plan.priority != "predicted":
        return None
    mean = state.task_turns.get(task)
    return None if mean is None else round(mean, 3)
