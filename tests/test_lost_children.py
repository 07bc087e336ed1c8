"""No trajectory is lost when its unit's workflow is (TrainingWorkflow against a dev server, stand-in activities).

A unit that fails, is terminated or never reports still ends in the ledger: the run that started it sees it
close; a run that continued as new asks the control worker (`describe_children`). A job whose trajectories all
fail for one reason no retry cures ends with that reason instead of launching forever.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable

import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from rollart.contracts.training import TrainingInput, TrainingResult, TrainingStatus
from rollart.infra.temporal.search_attributes import ensure_registered
from rollart.spec.config import JobSpec, TrainingConfig
from rollart.spec.pools import Pool, queue_name
from tests.support.standins import StandIns, full_marks, standin_workers
from tests.support.tasks import frozenlake_task, with_queue_prefix

pytestmark = pytest.mark.orchestration


def job(prefix: str, **training: object) -> JobSpec:
    """2-member multi-turn FrozenLake (a TrajectoryWorkflow per member), batches of 4."""
    task = frozenlake_task(group_size=2, max_turns=2)
    training = {"steps": 3, "batch_size": 4, "stall": {"check_every_s": 0.3}, **training}
    return with_queue_prefix(JobSpec(name="lost", tasks=[task], training=TrainingConfig(**training)), prefix)


async def start(client: Client, spec: JobSpec, prefix: str) -> WorkflowHandle:
    await ensure_registered(client)
    job_id = f"lost-{uuid.uuid4().hex[:8]}"
    return await client.start_workflow(
        "TrainingWorkflow",
        TrainingInput(job=spec, job_id=job_id, run_dir="/tmp/unused"),
        id=job_id,
        task_queue=queue_name(Pool.CONTROL, prefix),
        result_type=TrainingResult,
    )


def balanced(r: TrainingResult) -> bool:
    return r.started == r.trained + r.dropped + r.filtered + r.failed + r.cancelled_in_flight + r.buffered_unused


async def running_child(client: Client, job_id: str) -> str:
    """A trajectory workflow of the job that is running."""
    deadline = time.monotonic() + 30
    query = "WorkflowType = 'TrajectoryWorkflow' AND ExecutionStatus = 'Running'"
    while time.monotonic() < deadline:
        async for wf in client.list_workflows(query):
            if wf.id.startswith(job_id):
                return wf.id
        await asyncio.sleep(0.1)
    raise AssertionError(f"no running trajectory workflow of {job_id}")


async def terminate(client: Client, find: Callable[[], Awaitable[str]]) -> str:
    """Terminate a unit `find` names that had not reported yet; another if it closed in between (terminating a
    closed one is refused) or had reported: a unit runs on for a workflow task after its report's signal (longer on
    a loaded machine), and terminating it then loses nothing, so nothing would count as failed."""
    for _ in range(20):
        victim = await find()
        handle = client.get_workflow_handle(victim)
        try:
            await handle.terminate("a test's operator")
        except RPCError:  # it completed between the look and the terminate
            continue
        history = await handle.fetch_history()  # closed: whole
        if not any(e.HasField("signal_external_workflow_execution_initiated_event_attributes") for e in history.events):
            return victim
    raise AssertionError("every unit found had reported before it could be terminated")


async def carried_child(client: Client, job_id: str) -> str:
    """A trajectory workflow of the job still running whose parent run is not the latest: it continued as new.

    One listing a look: a unit outlives its run by about a second, and a look that read every earlier run's history
    and described each of its units, oldest first, took longer than that on a loaded machine and found none."""
    deadline = time.monotonic() + 60
    query = "WorkflowType = 'TrajectoryWorkflow' AND ExecutionStatus = 'Running'"
    while time.monotonic() < deadline:
        # the latest run before the listing: a unit listed with another parent run was started before it began
        latest = (await client.get_workflow_handle(job_id).describe()).run_id
        async for wf in client.list_workflows(query):
            if wf.id.startswith(job_id) and wf.parent_run_id not in (None, latest):
                return wf.id
        await asyncio.sleep(0.05)
    raise AssertionError(f"no unit of {job_id} outlived the run that started it")


async def test_a_job_whose_trajectories_all_fail_ends_with_the_reason(
    bare_env: WorkflowEnvironment, queue_prefix: str
) -> None:
    """Every trajectory workflow fails (its env is unknown: bad input, raised out of the workflow); none reports.
    Before, the parent counted none of them and waited forever; now it counts each and gives up at the limit."""
    w = StandIns(prefix=queue_prefix, turns=1, score=full_marks, unknown_env=True)
    async with standin_workers(bare_env.client, w):
        handle = await start(bare_env.client, job(queue_prefix, fail_after_failures=6), queue_prefix)
        with pytest.raises(WorkflowFailureError) as failure:
            await asyncio.wait_for(handle.result(), 60)
        status = await handle.query("status", result_type=TrainingStatus)
    cause = failure.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "JobFailing" and cause.non_retryable
    assert "in a row failed with UnknownComponent" in cause.message and "unknown env" in cause.message
    assert status.failed >= 8 and status.trained == 0  # a whole admission window: (bound 1 + 1) × 4
    assert status.started == status.failed + status.in_flight  # what was still running at the end is cancelled


async def test_a_terminated_child_counts_as_failed_and_the_job_goes_on(
    bare_env: WorkflowEnvironment, queue_prefix: str
) -> None:
    w = StandIns(prefix=queue_prefix, turns=1, stagger=1, score=full_marks, turn_delay_s=0.4, train_delay_s=0.05)
    async with standin_workers(bare_env.client, w):
        handle = await start(bare_env.client, job(queue_prefix), queue_prefix)
        await terminate(bare_env.client, lambda: running_child(bare_env.client, handle.id))
        result = await asyncio.wait_for(handle.result(), 90)
    assert result.version == 3 and result.failed >= 1 and balanced(result)


async def test_a_run_that_continued_as_new_finds_a_carried_child_that_was_terminated(
    bare_env: WorkflowEnvironment, queue_prefix: str
) -> None:
    """The run that started the unit is gone: the next one asks the control worker about the units it carried."""
    # units (1.5-3 s) outlive their run (a step, >= 1 s); each run checks on what it carried every 0.2 s
    w = StandIns(prefix=queue_prefix, turns=1, stagger=1, score=full_marks, turn_delay_s=1.5, train_delay_s=1.0)
    spec = job(queue_prefix, steps=6, async_bound=2, continue_as_new_every=1, stall={"check_every_s": 0.2})
    async with standin_workers(bare_env.client, w):
        handle = await start(bare_env.client, spec, queue_prefix)
        await terminate(bare_env.client, lambda: carried_child(bare_env.client, handle.id))
        result = await asyncio.wait_for(handle.result(), 120)
    assert result.version == 6 and result.failed >= 1 and balanced(result)
    asked = []
    run_id: str | None = None
    while True:  # every run of the job, from the last back along the chain
        history = await bare_env.client.get_workflow_handle(handle.id, run_id=run_id).fetch_history()
        asked += [
            e
            for e in history.events
            if e.HasField("activity_task_scheduled_event_attributes")
            and e.activity_task_scheduled_event_attributes.activity_type.name == "describe_children"
        ]
        first = history.events[0].workflow_execution_started_event_attributes
        if not first.continued_execution_run_id:
            break
        run_id = first.continued_execution_run_id
    assert asked, "no run asked about the units it carried"


async def test_cancelling_the_job_cancels_every_unit_playing_for_it(
    bare_env: WorkflowEnvironment, queue_prefix: str
) -> None:
    """Units are abandoned by a parent that closes (so they outlive a continue-as-new), so a cancelled job cancels
    them itself, in one go: none plays on for a job that is gone."""
    w = StandIns(prefix=queue_prefix, turns=1, stagger=1, score=full_marks, turn_delay_s=5.0)
    async with standin_workers(bare_env.client, w):
        handle = await start(bare_env.client, job(queue_prefix), queue_prefix)
        unit = await running_child(bare_env.client, handle.id)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(handle.result(), 30)
        history = await handle.fetch_history()
        cancelled = {
            e.request_cancel_external_workflow_execution_initiated_event_attributes.workflow_execution.workflow_id
            for e in history.events
            if e.HasField("request_cancel_external_workflow_execution_initiated_event_attributes")
        }
        assert unit in cancelled and len(cancelled) == 8  # (bound 1 + 1) × 4 in flight, one workflow each
        deadline = time.monotonic() + 20
        while (await bare_env.client.get_workflow_handle(unit).describe()).status == WorkflowExecutionStatus.RUNNING:
            assert time.monotonic() < deadline, f"{unit} still runs after its job was cancelled"
            await asyncio.sleep(0.1)
