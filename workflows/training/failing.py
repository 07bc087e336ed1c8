"""When a job should give up: its trajectories keep failing for one reason that no retry can cure.

A job given bad input (a model with no chat template for a chat task, an env that raises on every step) fails
every trajectory the same way; launching more only repeats it. Each failed trajectory whose failure names an
error type no retry can fix (its `error_type`: bad input that failed its workflow, an env that raised, ...) extends
the run of that type; a completed trajectory ends the run; failures a retry may cure (a lost worker, a timeout)
leave it as it is. A run of `training.fail_after_failures` ends the job with the reason. Pure: the workflow
calls it from its report handler.
"""

from __future__ import annotations

from collections.abc import Iterable

from rollart.contracts.rollouts import TrajectoryResult
from rollart.contracts.training import FailureRun, TrainingPlan, TrainingState

__all__ = ["observe", "verdict"]


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
    limit, run = plan.training.fail_after_failures, state.failing
    if limit is None or run is None or run.count < limit:
        return None
    return (
        f"{run.count} trajectories in a row failed with {run.error_type} and none completed since; the last: "
        f"{run.error} (the job gave up at training.fail_after_failures = {limit}; fix the cause, or set it "
        "higher or to null)"
    )
