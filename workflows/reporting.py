"""How a finished trajectory (or group, or lockstep batch) reaches the training workflow: one signal.

A signal that fails is sent again a little later (`RESEND_AFTER_S`); one that still fails is left: the unit
returns its results as well, and the training workflow takes what never reached it from how the unit closed
(workflows/training/workflow.py), so a lost report loses no trajectory.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from temporalio import workflow

from rollart.contracts.rollouts import TrajectoryResult

__all__ = ["RESEND_AFTER_S", "TRAJECTORIES_DONE", "report", "reporter"]

TRAJECTORIES_DONE = "trajectories_done"
"""The signal a finished trajectory (or lockstep batch) sends to the workflow named in `report_to`."""

RESEND_AFTER_S = (2.0, 10.0)
"""Waits before each resend of a report whose signal failed (the training workflow between runs, say)."""


async def report(report_to: str | None, results: list[TrajectoryResult]) -> None:
    """Signal finished trajectories to the training workflow (by id: it reaches its latest run)."""
    if not report_to:
        return
    parent = workflow.get_external_workflow_handle(report_to)
    for wait in (*RESEND_AFTER_S, None):
        try:
            await parent.signal(TRAJECTORIES_DONE, results)
            return
        except Exception as err:  # the training workflow is gone (stopped, terminated), or refused it
            if wait is None:
                workflow.logger.warning("could not report %d trajectories to %s: %s", len(results), report_to, err)
                return
            await workflow.sleep(wait)


def reporter(report_to: str | None) -> Callable[[list[TrajectoryResult]], Awaitable[None]]:
    """`report` bound to one parent, as the driver's per-unit callback."""

    async def send(results: list[TrajectoryResult]) -> None:
        await report(report_to, results)

    return send
