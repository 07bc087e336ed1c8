"""Stall detection against a real dev server: a generation pool with no worker is reported, clears, or ends the job.

The stand-ins serve every pool but `h800` at first, so every trajectory's `generate` waits on a queue nobody polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from temporalio import activity
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from rollart.activities.queues import QueueActivities
from rollart.client.connection import Outage
from rollart.client.train import MetricsWriter, follow
from rollart.contracts.generation import GenerateInput, GenerateResult
from rollart.contracts.training import TrainingInput, TrainingResult, TrainingStatus
from rollart.infra.temporal.search_attributes import ensure_registered
from rollart.infra.temporal.worker_tuning import workflow_runner
from rollart.spec.config import JobSpec, TemporalConfig, TrainingConfig, WorkerTuning
from rollart.spec.pools import Pool, queue_name
from rollart.workers.role_workers import pool_workers
from rollart.workers.settings import WorkerSettings
from rollart.workflows import ALL_WORKFLOWS
from tests.support.paths import REPO
from tests.support.standins import StandIns, full_marks, standin_workers
from tests.support.tasks import frozenlake_task, with_queue_prefix

pytestmark = pytest.mark.orchestration

FAST = {"check_every_s": 1, "no_worker_after_s": 2, "no_progress_min_s": 120}


def job(prefix: str, steps: int = 2, **stall: object) -> JobSpec:
    """`steps` steps of 4 FrozenLake trajectories (groups of 2) on h800, with stall checks every second."""
    spec = JobSpec(
        name="stall",
        tasks=[frozenlake_task(group_size=2, max_turns=2)],
        training=TrainingConfig(steps=steps, batch_size=4, stall={**FAST, **stall}),
    )
    return with_queue_prefix(spec, prefix)


async def start(env: WorkflowEnvironment, spec: JobSpec, prefix: str) -> WorkflowHandle:
    await ensure_registered(env.client)
    job_id = f"stall-{uuid.uuid4().hex[:8]}"
    return await env.client.start_workflow(
        "TrainingWorkflow",
        TrainingInput(job=spec, job_id=job_id, run_dir="/tmp/unused"),
        id=job_id,
        task_queue=queue_name(Pool.CONTROL, prefix),
        result_type=TrainingResult,
    )


async def status_until(handle: WorkflowHandle, ok, timeout_s: float = 30.0) -> TrainingStatus:
    """Query `status` every 0.25 s until `ok(status)`; a query the server drops is retried, as `rollart train` does."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            status = await handle.query("status", result_type=TrainingStatus)
        except RPCError:  # "buffered query cleared, please retry": its workflow task did not complete
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.25)
            continue
        if ok(status) or time.monotonic() > deadline:
            return status
        await asyncio.sleep(0.25)


async def details(handle: WorkflowHandle) -> str:
    """The workflow's current details, as the Temporal UI shows them."""
    meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return meta.current_details


async def assert_replays(env: WorkflowEnvironment, handle: WorkflowHandle) -> None:
    """The run's history (stall checks, current details, the failure) replays deterministically."""
    replayer = Replayer(
        workflows=ALL_WORKFLOWS,
        data_converter=env.client.data_converter,
        workflow_runner=workflow_runner(WorkerTuning(sandbox="strict")),
    )
    result = await replayer.replay_workflow(await handle.fetch_history(), raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure


async def test_a_pool_without_workers_is_reported_then_clears(bare_env: WorkflowEnvironment, queue_prefix: str) -> None:
    w = StandIns(prefix=queue_prefix, turns=1, stagger=1, score=full_marks, turn_delay_s=0.2)
    t0 = time.monotonic()
    timeline: list[str] = []
    async with standin_workers(bare_env.client, w, missing_pools=["h800"]):
        handle = await start(bare_env, job(queue_prefix, steps=12), queue_prefix)
        timeline.append(f"{time.monotonic() - t0:5.1f} s  job started, no worker on h800")
        stalled = await status_until(handle, lambda s: s.stalls)
        [stall] = stalled.stalls
        assert (stall.reason, stall.pool) == ("no_worker", "h800") and stall.backlog > 0
        assert stall.seen_at - stall.since >= FAST["no_worker_after_s"]
        assert (await details(handle)).startswith("stalled: no worker on h800 for ")
        timeline.append(f"{time.monotonic() - t0:5.1f} s  reported: {stall.describe()}")
        async with Worker(
            bare_env.client, task_queue=queue_name("h800", queue_prefix), activities=[w.generate, w.generate_batch]
        ):
            timeline.append(f"{time.monotonic() - t0:5.1f} s  h800 worker started")
            cleared = await status_until(handle, lambda s: not s.stalls)
            assert cleared.stalls == [] and not cleared.done  # cleared by a check, while the job runs on
            timeline.append(f"{time.monotonic() - t0:5.1f} s  stall cleared at step {cleared.step}")
            try:
                result = await asyncio.wait_for(handle.result(), 60)
            except TimeoutError:
                late = await handle.query("status", result_type=TrainingStatus)
                raise AssertionError(f"{timeline}\n{late.model_dump(exclude={'history'})}") from None
            timeline.append(f"{time.monotonic() - t0:5.1f} s  job finished: {result.steps} steps")
        status = await handle.query("status", result_type=TrainingStatus)
        assert await details(handle) == ""
    print("\n" + "\n".join(timeline))
    assert result.version == 12 and status.ledger_balanced and status.stalls == []
    await assert_replays(bare_env, handle)
    assert result.started == (
        result.trained
        + result.dropped
        + result.filtered
        + result.failed
        + result.cancelled_in_flight
        + result.buffered_unused
    )


@pytest.mark.parametrize("control", ["stand-in", "rollart worker --pool control"])
async def test_fail_after_ends_the_job_naming_the_pool(
    bare_env: WorkflowEnvironment, queue_prefix: str, control: str
) -> None:
    w = StandIns(prefix=queue_prefix, turns=1, stagger=1, score=full_marks)
    real = control != "stand-in"  # the control worker `rollart worker` runs: the workflows and describe_queues
    settings = WorkerSettings(pool=Pool.CONTROL, temporal=TemporalConfig(task_queue_prefix=queue_prefix))
    async with contextlib.AsyncExitStack() as stack:
        missing = ["h800", "control"] if real else ["h800"]
        await stack.enter_async_context(standin_workers(bare_env.client, w, missing_pools=missing))
        if real:
            for worker in await stack.enter_async_context(pool_workers(settings, bare_env.client, "control-test")):
                await stack.enter_async_context(worker)
        handle = await start(bare_env, job(queue_prefix, fail_after_s=3), queue_prefix)
        with pytest.raises(WorkflowFailureError) as failure:
            await asyncio.wait_for(handle.result(), 60)
    cause = failure.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "JobStalled" and cause.non_retryable
    assert "no worker on h800" in cause.message and "fail_after_s = 3 s" in cause.message
    await assert_replays(bare_env, handle)


async def test_a_long_stall_continues_as_new_and_keeps_its_clock(
    bare_env: WorkflowEnvironment, queue_prefix: str
) -> None:
    w = StandIns(prefix=queue_prefix, turns=1, stagger=1, score=full_marks)
    async with standin_workers(bare_env.client, w, missing_pools=["h800"]):
        handle = await start(bare_env, job(queue_prefix, check_every_s=0.5, history_events_max=100), queue_prefix)
        first_run = (await handle.describe()).run_id
        deadline = time.monotonic() + 60
        while (await handle.describe()).run_id == first_run and time.monotonic() < deadline:
            await asyncio.sleep(0.25)
        assert (await handle.describe()).run_id != first_run  # stalled, its history full: a fresh run
        [stall] = (await status_until(handle, lambda s: s.stalls)).stalls
        assert stall.pool == "h800" and stall.seen_at - stall.since >= 2.0  # the same stall, its clock carried over
        async with Worker(
            bare_env.client, task_queue=queue_name("h800", queue_prefix), activities=[w.generate, w.generate_batch]
        ):
            result = await asyncio.wait_for(handle.result(), 60)
    assert result.version == 2 and len(w.trained_ids) == len(set(w.trained_ids)) == result.trained
    assert result.started == (
        result.trained
        + result.dropped
        + result.filtered
        + result.failed
        + result.cancelled_in_flight
        + result.buffered_unused
    )


async def test_no_trajectory_finishing_is_a_stall_too(bare_env: WorkflowEnvironment, queue_prefix: str) -> None:
    w = StandIns(prefix=queue_prefix, turns=1, stagger=1, score=full_marks, turn_delay_s=0.05)
    gate, calls = asyncio.Event(), [0]

    @activity.defn(name="generate")
    async def generate(inp: GenerateInput) -> GenerateResult:
        """The stand-in engine, which hangs after its 24th answer until the gate opens (a wedged engine)."""
        calls[0] += 1
        if calls[0] > 24:
            await gate.wait()
        return await w.generate(inp)

    async with standin_workers(bare_env.client, w, missing_pools=["h800"]):
        async with Worker(bare_env.client, task_queue=queue_name("h800", queue_prefix), activities=[generate]):
            spec = job(queue_prefix, steps=8, no_progress_factor=2, no_progress_min_s=2)
            handle = await start(bare_env, spec, queue_prefix)
            [stall] = (await status_until(handle, lambda s: s.stalls, timeout_s=45)).stalls
            assert (stall.reason, stall.pool) == ("no_progress", None) and stall.in_flight > 0
            assert stall.describe().startswith("no trajectory finished for ")
            gate.set()
            assert (await status_until(handle, lambda s: not s.stalls or s.done)).stalls == []
            result = await asyncio.wait_for(handle.result(), 60)
    assert result.version == 8


@pytest.mark.chaos
@pytest.mark.timeout(240)
async def test_a_killed_worker_is_reported_within_seconds_then_replaced(
    bare_env: WorkflowEnvironment, queue_prefix: str, tmp_path: Path
) -> None:
    """SIGKILL the only h800 worker (a process of its own) mid-job: the stall is reported from its last heartbeat.

    Temporal lists a killed worker's poller for ~90 s, so judged by pollers the report would come after
    90 s + `no_worker_after_s`; judged by heartbeats it comes `no_worker_after_s` after the death. A
    replacement clears it and the job finishes with nothing lost.
    """
    after_s = 5.0
    w = StandIns(prefix=queue_prefix, turns=1, stagger=1, score=full_marks, turn_delay_s=0.2)
    address = bare_env.client.service_client.config.target_host
    engine = subprocess.Popen(
        [sys.executable, "-m", "tests.support.standin_engine", address, queue_prefix, str(tmp_path / "store")],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    timeline: list[str] = []
    try:
        assert engine.stdout is not None and engine.stdout.readline().strip() == "serving"
        async with standin_workers(bare_env.client, w, missing_pools=["h800"]):
            handle = await start(bare_env, job(queue_prefix, steps=10, no_worker_after_s=after_s), queue_prefix)
            await status_until(handle, lambda s: s.step >= 2, timeout_s=60)
            engine.kill()
            killed = time.monotonic()
            timeline.append("  0.0 s  h800 worker SIGKILLed")
            [stall] = (await status_until(handle, lambda s: s.stalls, timeout_s=60)).stalls
            detected = time.monotonic() - killed
            timeline.append(f"{detected:5.1f} s  reported: {stall.describe()}")
            assert (stall.reason, stall.pool) == ("no_worker", "h800") and stall.backlog > 0
            # heartbeats every 1 s: at most 2 missed + 5 s grace, then `after_s`, then a check (1 s); far under 90 s
            assert detected < after_s + 2 + 5 + 1 + 10, "\n".join(timeline)
            async with Worker(
                bare_env.client, task_queue=queue_name("h800", queue_prefix), activities=[w.generate, w.generate_batch]
            ):
                timeline.append(f"{time.monotonic() - killed:5.1f} s  replacement h800 worker started")
                await status_until(handle, lambda s: not s.stalls, timeout_s=30)
                timeline.append(f"{time.monotonic() - killed:5.1f} s  stall cleared")
                result = await asyncio.wait_for(handle.result(), 120)
                timeline.append(f"{time.monotonic() - killed:5.1f} s  job finished: {result.version} steps")
    finally:
        engine.kill()
        engine.wait()
    print("\n" + "\n".join(timeline))
    assert result.version == 10 and result.failed == 0
    assert result.started == (
        result.trained
        + result.dropped
        + result.filtered
        + result.failed
        + result.cancelled_in_flight
        + result.buffered_unused
    )


@pytest.mark.timeout(180)
async def test_a_job_no_worker_serves_says_so_to_status_and_followers(
    bare_env: WorkflowEnvironment, queue_prefix: str, tmp_path: Path
) -> None:
    """No control worker: nothing runs the job, so it cannot report itself; its clients ask Temporal and say so."""
    w = StandIns(prefix=queue_prefix, turns=1, stagger=1, score=full_marks)
    async with standin_workers(bare_env.client, w, missing_pools=["control"]):
        handle = await start(bare_env, job(queue_prefix), queue_prefix)
        address = bare_env.client.service_client.config.target_host
        status = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "rollart.cli",
            "status",
            handle.id,
            "--temporal-address",
            address,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            cwd=REPO,
        )
        out = (await status.communicate())[0].decode()
        control = queue_name(Pool.CONTROL, queue_prefix)
        assert status.returncode == 2, out
        assert f"no worker serves job {handle.id}'s workflow queue '{control}' (none seen)" in out, out
        said: list[str] = []
        following = asyncio.create_task(
            follow(
                handle,
                MetricsWriter(tmp_path),
                lambda row: None,
                poll_s=0.2,
                outage=Outage(say=said.append),
                client=bare_env.client,
            )
        )
        deadline = time.monotonic() + 30
        while not said and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert said and said[0].startswith(f"no worker serves job {handle.id}'s workflow queue"), said
        async with Worker(
            bare_env.client,
            task_queue=control,
            workflows=list(ALL_WORKFLOWS),
            workflow_runner=workflow_runner(WorkerTuning(sandbox="strict")),
            activities=[QueueActivities(bare_env.client).describe_queues],
        ):
            result = await asyncio.wait_for(following, 60)
    assert result.version == 2
    assert said == [said[0], "the job answers again: a worker serves its workflow queue"]
