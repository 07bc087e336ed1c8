"""How a finished trajectory (or group, or lockstep batch) reaches the training workflow: one signal."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from temporalio import workflow

from rollart.contracts.rollouts import TrajectoryResult

__all__ = ["TRAJECTORIES_DONE", "report", "reporter"]

TRAJECTORIES_DONE = "trajectories_done"
"""The signal a finished trajectory (or lockstep batch) sends to the workflow named in `report_to`."""


async def report(report_to: str | None, results: list[TrajectoryResult]) -> None:
    """Signal finished trajectories to the training workflow (by id: it reaches its latest run)."""
    if not report_to:
        return
    try:
        await workflow.get_external_workflow_handle(report_to).signal(TRAJECTORIES_DONE, results)
    except Exception as err:  # the training workflow is gone (stopped, terminated): nothing to report to
        workflow.logger.warning("could not report %d trajectories to %s: %s", len(results), report_to, err)


def reporter(report_to: str | None) -> Callable[[list[TrajectoryResult]], Awaitable[None]]:
    """`report` bound to one parent, as the driver's per-unit callback."""

    async def send(results: list[TrajectoryResult]) -> None:
        await report(report_to, results)

    return send
