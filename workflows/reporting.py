"""How a finished trajectory (or group, or lockstep batch) reaches the training workflow: one signal.

A signal that fails is sent again a little later (`RESEND_AFTER_S`); one that still fails is kept: the unit returns
what it could not deliver, and the training workflow takes that from how the unit closed
(workflows/training/watching.py), so a lost report loses no trajectory. What did reach it is not returned again:
a result enters the training workflow's history once (issue 48: the parent records little).
"""

from __future__ import annotations

from temporalio import workflow

from rollart.contracts.rollouts import TrajectoryResult

__all__ = ["RESEND_AFTER_S", "TRAJECTORIES_DONE", "Reporter", "report"]

TRAJECTORIES_DONE = "trajectories_done"
"""The signal a finished trajectory (or lockstep batch) sends to the workflow named in `report_to`."""

RESEND_AFTER_S = (2.0, 10.0)
"""Waits before each resend of a report whose signal failed (the training workflow between runs, say)."""


async def report(report_to: str | None, results: list[TrajectoryResult]) -> bool:
    """Signal finished trajectories to the training workflow (by id: it reaches its latest run). True once it has
    them; False when there is no one to report to, or the signal kept failing."""
    if not report_to:
        return False
    parent = workflow.get_external_workflow_handle(report_to)
    wire = [r.model_dump(mode="json", exclude_defaults=True) for r in results]  # the parent's side fills them in
    for wait in (*RESEND_AFTER_S, None):
        try:
            await parent.signal(TRAJECTORIES_DONE, wire)
            return True
        except Exception as err:  # the training workflow is gone (stopped, terminated), or refused it
            if wait is None:
                workflow.logger.warning("could not report %d trajectories to %s: %s", len(results), report_to, err)
                return False
            await workflow.sleep(wait)
    return False


class Reporter:
    """A unit's report callback (the driver calls it as each group or episode finishes) that keeps what it could
    not deliver: that, and only that, is what the unit returns. Without `report_to` (a rollout a client started
    and waits on), nothing is delivered and everything is returned."""

    def __init__(self, report_to: str | None) -> None:
        self.report_to = report_to
        self.undelivered: list[TrajectoryResult] = []

    async def __call__(self, results: list[TrajectoryResult]) -> None:
        if not await report(self.report_to, results):
            self.undelivered.extend(results)
