"""When a job should give up: its trajectories keep failing for one reason that no retry can cure.

A job given bad input (a model with no chat template for a chat task, an env that raises on every step) fails
every trajectory the same way; launching more only repeats it. Each failed trajectory whose failure names an
error type no retry can fix (its `error_type`: bad input that failed its workflow, an env that raised, ...) extends
the run of that type; a completed trajectory ends the run; failures a retry may cure (a lost worker, a timeout)
leave it as it is. The job ends once the run covers a whole admission window (`training.in_flight_limit`, and at
least `training.fail_after_failures`): every trajectory that was in flight failed, so none can still complete.
A shorter run proves nothing at scale: failures come back in seconds while completions take minutes, so the first
reports of a job with a few per cent of broken envs are all failures. Pure: both shells call it after reports.
"""

from __future__ import annotations

from collections.abc import Iterable

from rollart.contracts.rollouts import TrajectoryResult
from rollart.contracts.training import FailureRun, TrainingPlan, TrainingState

__all__ = ["observe", "threshold", "verdict"]


def observe(state: TrainingState, results: Iterable[TrajectoryResult]) -> None:
    """Extend, restart or end the run of failures with results still in flight (call it before the ledger)."""
    for r in results:
        if r.trajectory_id not in state.in_flight:
            continue
        if r.status == "completed":
            state.failing = None
        elif r.status == "failed" and r.error_type is not None:
            run = state.failing
            if run is not None and run.error_type == r.error_type:
                state.failing = FailureRun(error_type=r.error_type, error=r.error or run.error, count=run.count + 1)
            else:
                state.failing = FailureRun(error_type=r.error_type, error=r.error or "", count=1)


def verdict(plan: TrainingPlan, state: TrainingState) -> str | None:
    """Why the job should end now (the message it fails with), or None."""
    needed, run = threshold(plan), state.failing
    if needed is None or run is None or run.count < needed:
        return None
    return (
        f"{run.count} trajectories in a row failed with {run.error_type} and none completed since; the last: "
        f"{run.error} (the job gives up once a whole admission window fails: {needed}, at least "
        "training.fail_after_failures; fix the cause, or set that to null)"
    )


def threshold(plan: TrainingPlan) -> int | None:
    """How many failures in a row end the job: the admission window (what may be in flight), at least the
    setting; None: never."""
    limit = plan.training.fail_after_failures
    return None if limit is None else max(limit, plan.training.in_flight_limit)
