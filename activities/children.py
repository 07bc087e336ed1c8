"""On the control queue: `describe_children`, which of a training job's units (child workflows started by an
earlier run, before a continue-as-new) have closed, and how.

A unit reports its trajectories to the training workflow by signal. The run that started a unit also sees it
close (its child handle); a run that continued as new does not, so it asks here about the units it carried
until each has reported. One that completed gives back its results (a report that never arrived is taken from
them); one that failed, timed out or was terminated gives its cause, and its trajectories count as failed.
"""

from __future__ import annotations

import asyncio

from temporalio import activity
from temporalio.api.enums.v1 import WorkflowExecutionStatus
from temporalio.client import Client, WorkflowFailureError
from temporalio.service import RPCError, RPCStatusCode

from rollart.contracts.errors import failure_of
from rollart.contracts.rollouts import ChildOutcome, DescribeChildrenInput, DescribeChildrenResult, TrajectoryResult

__all__ = ["ChildActivities"]

_AT_ONCE = 32  # describe calls in flight at once: a few hundred units take a few seconds, not a burst

_CLOSED = {
    WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_COMPLETED: "completed",
    WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_FAILED: "failed",
    WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_TIMED_OUT: "timed_out",
    WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_TERMINATED: "terminated",
    WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_CANCELED: "canceled",
}


class ChildActivities:
    """Reads the units' workflows through the control worker's own client (workflows cannot describe others)."""

    def __init__(self, client: Client) -> None:
        self.client = client

    @activity.defn(name="describe_children")
    async def describe_children(self, inp: DescribeChildrenInput) -> DescribeChildrenResult:
        """The closed ones among `workflow_ids`, with their results or their cause."""
        gate = asyncio.Semaphore(_AT_ONCE)

        async def one(wid: str) -> ChildOutcome | None:
            async with gate:
                return await self._outcome(wid)

        outcomes = await asyncio.gather(*(one(w) for w in inp.workflow_ids))
        return DescribeChildrenResult(closed=[o for o in outcomes if o is not None])

    async def _outcome(self, wid: str) -> ChildOutcome | None:
        handle = self.client.get_workflow_handle(wid)
        try:
            described = await handle.describe()
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            return ChildOutcome(workflow_id=wid, status="not_found", error="its workflow is gone (retention?)")
        status = _CLOSED.get(described.raw_description.workflow_execution_info.status)
        if status is None:  # still running
            return None
        try:
            value = await handle.result(follow_runs=False)
        except WorkflowFailureError as err:
            error, error_type = failure_of(err)
            return ChildOutcome(workflow_id=wid, status=status, error=error, error_type=error_type)
        values = value if isinstance(value, list) else [value]
        results = [TrajectoryResult.model_validate(v) for v in values if v is not None]
        return ChildOutcome(workflow_id=wid, status=status, results=results)
