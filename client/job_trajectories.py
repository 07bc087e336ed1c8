"""A job's trajectories, one row each, as `rollart trajectories` and the report list them: found through Temporal's
visibility (the job's rollout workflows), read from their histories (what each reported or returned), filtered by
task, failure or reward."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus

from rollart.client.trajectory_view import ROLLOUT_WORKFLOWS
from rollart.client.unit_history import results_of
from rollart.contracts.rollouts import TrajectoryResult
from rollart.infra.temporal.search_attributes import JOB_ID, TASK

__all__ = ["TrajectoryRow", "job_query", "list_trajectories", "pick_rows"]


@dataclass(frozen=True)
class TrajectoryRow:
    """One trajectory of a job, as `rollart trajectories` lists it."""

    trajectory_id: str
    workflow_id: str
    task: str
    status: str  # completed, failed (the episode, or its workflow), cancelled (its workflow: the job ended), running
    reward: float | None = None
    success: bool | None = None
    turns: int | None = None
    versions: str = "-"
    error: str | None = None


# A rollout workflow cancelled or terminated from outside: the training job ended (or was stopped) while it ran.
_ENDED_BY_OTHERS = (WorkflowExecutionStatus.CANCELED, WorkflowExecutionStatus.TERMINATED)


def job_query(job_id: str) -> str:
    """Visibility query for a job's rollout workflows: children of a training job, or `rollart rollout`'s."""
    types = ", ".join(f"'{t}'" for t in ROLLOUT_WORKFLOWS)
    return f"WorkflowType IN ({types}) AND ({JOB_ID.name} = '{job_id}' OR WorkflowId STARTS_WITH '{job_id}-')"


async def list_trajectories(
    client: Client, job_id: str, limit: int = 10_000, concurrency: int = 16
) -> list[TrajectoryRow]:
    """Every trajectory of the job's rollout workflows; a workflow that failed as a whole is one failed row."""
    found = [wf async for wf in client.list_workflows(job_query(job_id), limit=limit)]
    gate = asyncio.Semaphore(concurrency)

    async def rows(wf: Any) -> list[TrajectoryRow]:
        async with gate:
            return await _rows(client, wf)

    chunks = await asyncio.gather(*(rows(wf) for wf in found))
    return sorted((r for chunk in chunks for r in chunk), key=lambda r: r.trajectory_id)


async def _rows(client: Client, wf: Any) -> list[TrajectoryRow]:
    """Its trajectories' rows from what it reported or returned (client/unit_history.py); a unit that did not complete
    adds one row for the rest, with how it ended."""
    reported = [_row(r, wf.id) for r in await results_of(client, wf.id, wf.run_id)]
    if wf.status == WorkflowExecutionStatus.COMPLETED or (wf.workflow_type == "TrajectoryWorkflow" and reported):
        return reported
    status = (
        "running"
        if wf.status == WorkflowExecutionStatus.RUNNING
        else "cancelled"
        if wf.status in _ENDED_BY_OTHERS
        else "failed"
    )
    task = wf.typed_search_attributes.get(TASK) or "?"
    return [
        *reported,
        TrajectoryRow(
            trajectory_id=wf.id,
            workflow_id=wf.id,
            task=task,
            status=status,
            error=None if status == "running" else f"workflow {wf.status.name.lower()}",
        ),
    ]


def _row(r: TrajectoryResult, workflow_id: str) -> TrajectoryRow:
    versions = f"v{r.policy_version_min}..v{r.policy_version_max}" if r.policy_version_min is not None else "-"
    return TrajectoryRow(
        trajectory_id=r.trajectory_id,
        workflow_id=workflow_id,
        task=r.task,
        status=r.status,
        reward=r.reward,
        success=r.success,
        turns=r.turns,
        versions=versions,
        error=r.error,
    )


def pick_rows(
    rows: list[TrajectoryRow],
    task: str | None = None,
    failed: bool = False,
    worst: int | None = None,
    best: int | None = None,
) -> list[TrajectoryRow]:
    """Filter by task and failure, then the `worst` lowest or `best` highest rewards (failed ones have none)."""
    picked = [r for r in rows if (task is None or r.task == task) and (not failed or r.status != "completed")]
    if worst is not None or best is not None:
        scored = [r for r in picked if r.reward is not None]
        scored.sort(key=lambda r: r.reward, reverse=best is not None)  # type: ignore[arg-type, return-value]
        picked = scored[: best if best is not None else worst]
    return picked
