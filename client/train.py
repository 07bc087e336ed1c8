"""Client side of training: start the TrainingWorkflow, follow its status, write metrics.jsonl."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

from rollart.contracts.training import StepRecord, TrainingInput, TrainingPlan, TrainingResult, TrainingStatus
from rollart.infra import search_attributes as sa
from rollart.infra.config import JobSpec
from rollart.infra.pools import Pool, queue_name
from temporalio.client import Client, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError

__all__ = ["MetricsWriter", "follow", "start_training", "status_of", "terminate_job"]


async def start_training(client: Client, job: JobSpec, job_id: str, run_dir: Path) -> WorkflowHandle:
    """Register the search attributes if needed, then start the job's TrainingWorkflow (id = job id)."""
    await sa.ensure_registered(client)
    return await client.start_workflow(
        "TrainingWorkflow",
        TrainingInput(plan=TrainingPlan.of(job), job_id=job_id, run_dir=str(run_dir.resolve())),
        id=job_id,
        task_queue=queue_name(Pool.CONTROL, job.temporal.task_queue_prefix),
        result_type=TrainingResult,
        search_attributes=TypedSearchAttributes([
            SearchAttributePair(sa.JOB_ID, job_id), SearchAttributePair(sa.STEP, 0),
            SearchAttributePair(sa.POLICY_VERSION, 0),
        ]),  # fmt: skip
    )


async def status_of(handle: WorkflowHandle) -> TrainingStatus:
    """The live status query."""
    return await handle.query("status", result_type=TrainingStatus)


class MetricsWriter:
    """Appends each new step record to `metrics.jsonl` once, with elapsed time and rates since the start."""

    def __init__(self, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / "metrics.jsonl"
        self.written = -1
        self.last_time: float | None = None

    def write(self, records: list[StepRecord], started_at: float) -> list[dict]:
        """Write the records not yet written; returns them as dicts (with derived fields)."""
        new = []
        with self.path.open("a") as f:
            for r in records:
                if r.step <= self.written:
                    continue
                elapsed = max(r.time - started_at, 1e-9)
                interval = max(r.time - (self.last_time if self.last_time is not None else started_at), 1e-9)
                row = {**r.model_dump(), "elapsed_s": elapsed, "step_interval_s": interval,
                       "trajectories_per_s": (r.trained + r.dropped + r.failed + r.buffered) / elapsed,
                       "tokens_per_s": r.completion_tokens / interval}  # fmt: skip
                self.last_time = r.time
                f.write(json.dumps(row) + "\n")
                self.written = r.step
                new.append(row)
        return new


async def follow(
    handle: WorkflowHandle,
    writer: MetricsWriter,
    on_step: Callable[[dict], None],
    poll_s: float = 1.0,
    on_status: Callable[[TrainingStatus], None] | None = None,
) -> TrainingResult:
    """Poll the status query until the workflow ends; every new step goes to metrics.jsonl and `on_step`,
    every status to `on_status` (the progress bar's stall line)."""
    result_task = asyncio.create_task(handle.result())
    started_at: float | None = None
    while True:
        try:
            status = await status_of(handle)
            started_at = status.started_at
            for row in writer.write(status.history, started_at):
                on_step(row)
            if on_status is not None:
                on_status(status)
        except RPCError:
            pass  # between runs (continue-as-new) or the server is restarting: try again
        done, _ = await asyncio.wait({result_task}, timeout=poll_s)
        if done:
            result: TrainingResult = result_task.result()
            if result.last is not None and started_at is not None:
                for row in writer.write([result.last], started_at):
                    on_step(row)
            return result


async def terminate_job(client: Client, job_id: str, reason: str) -> int:
    """Terminate a job's training workflow and every trajectory of it still running; returns how many."""
    n = 0
    async for wf in client.list_workflows(f'{sa.JOB_ID.name} = "{job_id}" AND ExecutionStatus = "Running"'):
        try:
            await client.get_workflow_handle(wf.id, run_id=wf.run_id).terminate(reason=reason)
            n += 1
        except RPCError:
            pass  # it ended meanwhile
    return n
