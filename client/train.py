"""Client side of training: start the TrainingWorkflow, follow its status, write metrics.jsonl."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from pathlib import Path

from temporalio.client import Client, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError

from rollart.client.connection import Outage, is_unreachable, probe
from rollart.client.exporters import Exporter
from rollart.client.unserved import Unserved
from rollart.contracts.training import (
    StepRecord,
    TrainingInput,
    TrainingPlan,
    TrainingResult,
    TrainingStatus,
    played_success,
)
from rollart.infra.temporal import search_attributes as sa
from rollart.spec.config import JobSpec, resolve
from rollart.spec.pools import Pool, queue_name

__all__ = [
    "MetricsWriter",
    "follow",
    "not_learned_note",
    "run_dir_of",
    "start_training",
    "status_of",
    "terminate_job",
]


async def start_training(client: Client, job: JobSpec, job_id: str, run_dir: Path) -> WorkflowHandle:
    """Register the search attributes if needed, then start the job's TrainingWorkflow (id = job id).

    The plan is taken from the job resolved here (`resolve`: a job made in code has not been), so that it carries
    where each task's env and reward declare they run."""
    await sa.ensure_registered(client)
    return await client.start_workflow(
        "TrainingWorkflow",
        TrainingInput(plan=TrainingPlan.of(resolve(job)), job_id=job_id, run_dir=str(run_dir.resolve())),
        id=job_id,
        task_queue=queue_name(Pool.CONTROL, job.temporal.task_queue_prefix),
        result_type=TrainingResult,
        search_attributes=TypedSearchAttributes(
            [
                SearchAttributePair(sa.JOB_ID, job_id),
                SearchAttributePair(sa.STEP, 0),
                SearchAttributePair(sa.POLICY_VERSION, 0),
            ]
        ),
    )


def not_learned_note(result: TrainingResult, rows: Sequence[dict], run_dir: Path) -> str | None:
    """What to tell a user whose job used up `training.steps` without its `stop_when` rule holding: the success at
    the end and the best step seen (`rows`: metrics.jsonl), and where to look. None when the job learned, was
    stopped, or has no rule to judge it by.

    Why: "trained all 200 steps" reads like success; a run that did not learn must say so in its last lines."""
    if result.ended_by != "steps" or result.stop_when is None or not rows:
        return None
    successes = [(played_success(r), r["step"]) for r in rows]
    best, best_step = max(successes, key=lambda s: (s[0], -s[1]))
    last = successes[-1][0]
    return (
        f"not learned in {result.steps} steps (stop_when: {result.stop_when.describe()}): success {last:.2f} at "
        f"the end, best {best:.2f} (step {best_step}). Look at the curves (rollart report {run_dir}) and at "
        "docs/learning.md (what the examples reach, and the knobs that matter)"
    )


async def run_dir_of(client: Client, job_id: str) -> Path:
    """The run dir a job was started with: read from its current run's input (continue-as-new carries it)."""
    handle = client.get_workflow_handle(job_id)
    async for event in handle.fetch_history_events():
        payloads = event.workflow_execution_started_event_attributes.input.payloads
        (inp,) = await client.data_converter.decode(payloads, [TrainingInput])
        return Path(inp.run_dir)
    raise ValueError(f"workflow {job_id!r} has no history")


async def status_of(handle: WorkflowHandle) -> TrainingStatus:
    """The live status query."""
    return await handle.query("status", result_type=TrainingStatus)


class MetricsWriter:
    """Appends each new step record to `metrics.jsonl` once, with elapsed time and rates since the start.

    A file already there (a re-attached client) is continued: its steps are not written again. The `exporters`
    (TensorBoard, W&B: `client/exporters.py`) get the same new rows; `close` closes them.
    """

    def __init__(self, run_dir: Path, exporters: Sequence[Exporter] = ()) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / "metrics.jsonl"
        self.exporters = list(exporters)
        self.written = -1
        self.last_time: float | None = None
        text = self.path.read_text() if self.path.exists() else ""
        if text and not text.endswith("\n"):  # the last client died mid-line: drop it, its step is written again
            text = text[: text.rfind("\n") + 1]
            self.path.write_text(text)
        for line in text.splitlines():
            row = json.loads(line)
            self.written, self.last_time = row["step"], row["time"]

    def write(self, records: list[StepRecord], started_at: float) -> list[dict]:
        """Write the records not yet written; returns them as dicts (with derived fields)."""
        new = []
        with self.path.open("a") as f:
            for r in records:
                if r.step <= self.written:
                    continue
                elapsed = max(r.time - started_at, 1e-9)
                interval = max(r.time - (self.last_time if self.last_time is not None else started_at), 1e-9)
                row = {
                    **r.model_dump(),
                    "elapsed_s": elapsed,
                    "step_interval_s": interval,
                    "trajectories_per_s": (r.trained + r.dropped + r.filtered + r.failed + r.buffered) / elapsed,
                    "tokens_per_s": r.completion_tokens / interval,
                }
                self.last_time = r.time
                f.write(json.dumps(row) + "\n")
                self.written = r.step
                new.append(row)
        if new:
            for exporter in self.exporters:
                exporter.write(new)
        return new

    def close(self) -> None:
        """Close the exporters (flushed already: each write is)."""
        for exporter in self.exporters:
            exporter.close()


async def follow(
    handle: WorkflowHandle,
    writer: MetricsWriter,
    on_step: Callable[[dict], None],
    poll_s: float = 1.0,
    outage: Outage | None = None,
    client: Client | None = None,
    on_status: Callable[[TrainingStatus], None] | None = None,
) -> TrainingResult:
    """Poll the status query until the workflow ends; every new step goes to metrics.jsonl and `on_step`,
    every status to `on_status` (the progress bar's stall line).

    A server outage is waited out: the status poll backs off (capped) and the result wait, which dies with
    the connection, is started again; `outage` says when the server went away and when it came back (at
    once with `client`, whose health is checked before each poll; else when the SDK's retries give up).
    """
    outage = outage or Outage()
    unserved = Unserved(say=outage.say)
    result_task = asyncio.create_task(handle.result())
    started_at: float | None = None
    try:
        while True:
            if client is None or await probe(client, outage):
                started_at = await _poll(handle, writer, on_step, outage, unserved, started_at, client, on_status)
            done, _ = await asyncio.wait({result_task}, timeout=outage.next_delay() if outage.down else poll_s)
            if not done:
                continue
            error = result_task.exception()
            if error is not None and is_unreachable(error):
                outage.failed(error)
                result_task = asyncio.create_task(handle.result())  # the wait died with the connection
                continue
            result: TrainingResult = result_task.result()
            outage.ok()
            started_at = await _poll(
                handle, writer, on_step, outage, unserved, started_at, client, on_status
            )  # steps since the last poll
            if result.last is not None and started_at is not None:
                for row in writer.write([result.last], started_at):
                    on_step(row)
            return result
    finally:
        result_task.cancel()


async def _poll(
    handle: WorkflowHandle,
    writer: MetricsWriter,
    on_step: Callable[[dict], None],
    outage: Outage,
    unserved: Unserved,
    started_at: float | None,
    client: Client | None,
    on_status: Callable[[TrainingStatus], None] | None = None,
) -> float | None:
    """One status query: new steps to the writer and `on_step`; returns the job's start time once known.

    A query that has not answered in 5 s is dropped (no worker answers, or the server is gone: the SDK would
    retry a call to a dead server for ~10 s before saying so) and, with `client`, the server's health checked;
    a healthy server with nobody serving the job's workflow queue is said once (`unserved`).
    """
    try:
        status = await asyncio.wait_for(status_of(handle), 5.0)
    except TimeoutError:
        if client is not None and await probe(client, outage):
            await unserved.no_answer(client, handle)
        return started_at
    except RPCError as e:
        if is_unreachable(e):
            outage.failed(e)
        else:
            outage.ok()  # the server answered (between runs of continue-as-new, no worker yet): try again
        return started_at
    outage.ok()
    unserved.answered()
    for row in writer.write(status.history, status.started_at):
        on_step(row)
    if on_status is not None:
        on_status(status)
    return status.started_at


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
