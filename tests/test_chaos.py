"""Chaos: real worker processes killed with SIGKILL (by PID) and the Temporal server restarted, mid-training.

One local stack for the module: a dev server on SQLite and two worker
processes for each of cpu, h800 and serverless (so a retry has somewhere to go),
one control and one trainer. Generation uses the plain transformers engine
(the chaos is in the orchestration, not in vLLM). The job runs with injected
env faults (lognormal reset latency, 5 % reset failures) and the pre-reset pool.

`control`: the job continues as new every step or so (lowered `temporal.limits`), and the control worker,
which runs every workflow, is killed as a run nears its continue-as-new.

Each run must reach its step count with the ledger balanced (started = trained
+ dropped + failed + in flight + buffered) and no trajectory trained twice.
Set ROLLART_CHAOS_REPORT=path to append each run's timings as a JSON line.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import psutil
import pytest
from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError

from rollart.client.train import start_training
from rollart.contracts.activities import TrainStepInput
from rollart.contracts.training import TrainingResult, TrainingStatus
from rollart.infra.local.devserver import free_port
from rollart.infra.temporal.connection import connect
from rollart.spec.config import EngineConfig, JobSpec, StoreConfig, TemporalLimits, TrainerConfig, TrainingConfig
from rollart.spec.pools import Pool
from rollart.workers.local_stack import LocalStack
from tests.support.tasks import frozenlake_task

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

TWO_EACH = (Pool.CPU, Pool.H800, Pool.SERVERLESS)
STEPS = 5


@pytest.fixture(scope="module")
def chaos_stack(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[LocalStack]:
    home = tmp_path_factory.mktemp("chaos")
    task = frozenlake_task(
        group_size=2,
        max_turns=4,
        env_args={"maps": "standard"},
        reset_pool_size=2,
        sampling={"max_tokens": 8},
        faults={
            "reset_latency": {"median_s": 0.02, "p99_s": 0.5},
            "step_latency": {"median_s": 0.02, "p99_s": 0.2},
            "reset_failure_p": 0.05,
        },
    )
    job = JobSpec(
        name="chaos",
        model_dir=tiny_model,
        tasks=[task],
        engine=EngineConfig(kind="hf", max_model_len=256),
        store=StoreConfig(path=home / "store"),
        training=TrainingConfig(steps=STEPS, batch_size=8, async_bound=1),
    )
    pools = [Pool.CONTROL, *TWO_EACH, *TWO_EACH, Pool.TRAINER]
    stack = LocalStack(job=job, pools=pools, home=home, port=free_port(), ui_port=None, autoscale=False)
    stack.start(timeout_s=300)
    yield stack
    stack.stop()


@pytest.fixture(scope="module")
async def chaos_client(chaos_stack: LocalStack) -> AsyncIterator[Client]:
    yield await connect(chaos_stack.temporal, chaos_stack.job.store)


def _replenish(stack: LocalStack) -> None:
    """Two live workers for each duplicated pool and one trainer, whatever the last run killed."""
    for pool in TWO_EACH:
        while len(stack.live_workers(pool)) < 2:
            stack.add_worker(pool)
    for pool in (Pool.TRAINER, Pool.CONTROL):
        if not stack.live_workers(pool):
            stack.add_worker(pool)


async def _kill_control_as_a_run_nears_its_end(
    stack: LocalStack, handle: WorkflowHandle, events: int = 50, timeout_s: float = 120
) -> tuple[float, str, str]:
    """SIGKILL the control worker, which runs every workflow, once a run of the training workflow (not the one
    running now) has `events` events, about half of what it continues as new at, and start a replacement: the run's
    continue-as-new is then decided on the replacement, after it replayed the run. The wall time of the kill, the
    run and the killed worker's identity."""
    current = (await handle.describe()).run_id
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        desc = await handle.describe()
        if desc.run_id != current and desc.raw_description.workflow_execution_info.history_length >= events:
            [pid] = stack.live_workers(Pool.CONTROL)
            killed = stack.worker_id(pid)
            kill_wall = time.time()
            stack.kill_worker(pid)
            stack.add_worker(Pool.CONTROL)
            return kill_wall, desc.run_id, killed
        await asyncio.sleep(0.01)
    pytest.fail(f"no new run of {handle.id} reached {events} events within {timeout_s:g}s")


async def _status(handle: WorkflowHandle) -> TrainingStatus | None:
    try:
        return await handle.query("status", result_type=TrainingStatus)
    except RPCError:  # the server is restarting
        return None


async def _wait_step(handle: WorkflowHandle, step: int, timeout_s: float = 240) -> float:
    """Wait until the job has finished `step` steps; returns when (monotonic)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        s = await _status(handle)
        if s is not None and s.step >= step:
            return time.monotonic()
        await asyncio.sleep(0.1)
    raise TimeoutError(f"job did not reach step {step} in {timeout_s:g}s")


async def _train_step_running(handle: WorkflowHandle, timeout_s: float = 60) -> str:
    """Wait until a train_step is running on the trainer, so the kill lands mid-step; its activity id. Fails the
    test if none does."""
    deadline = time.monotonic() + timeout_s
    seen: list[str] = []
    while time.monotonic() < deadline:
        desc = await handle.describe()
        for a in desc.raw_description.pending_activities:
            if a.activity_type.name == "train_step" and a.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED:
                return a.activity_id
        seen = [
            f"{a.activity_type.name} ({PendingActivityState.Name(a.state)})"
            for a in desc.raw_description.pending_activities
        ]
        await asyncio.sleep(0.02)
    pytest.fail(
        f"no train_step of {handle.id} was running within {timeout_s:g}s, so no kill could land mid-step; "
        f"pending at the end: {seen or 'nothing'}"
    )


async def _kill_mid_step(handle: WorkflowHandle, kill: Callable[[], None], tries: int = 3) -> float:
    """`kill()` while a train_step runs; the wall time of the kill that interrupted one.

    A step of the tiny model takes a fraction of a second, so the step seen running may have finished by the
    time the signal lands; then the step was not interrupted (it is no longer pending) and the next one is
    tried, until one is. (`tries=1` where a kill between steps fails the next step anyway: a dead rank.)
    """
    kill_wall = 0.0
    for _ in range(tries):
        step = await _train_step_running(handle)
        kill_wall = time.time()
        kill()
        desc = await handle.describe()
        if any(a.activity_id == step for a in desc.raw_description.pending_activities):
            return kill_wall  # still pending after its worker died: it was interrupted and will be retried
    if tries == 1:
        return kill_wall
    pytest.fail(f"none of {tries} kills landed while a train_step ran")


async def _trained_ids(client: Client, handle: WorkflowHandle) -> list[str]:
    """Every sample id sent to train_step, across all runs of the job (from the workflow histories)."""
    ids: list[str] = []
    async for wf in client.list_workflows(f'WorkflowId="{handle.id}"'):
        history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        for ev in history.events:
            if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                attrs = ev.activity_task_scheduled_event_attributes
                if attrs.activity_type.name == "train_step":
                    [inp] = await client.data_converter.decode(attrs.input.payloads, [TrainStepInput])
                    ids += [s.trajectory_id for s in inp.samples]
    return ids


async def _resumed_after(client: Client, job_id: str, kill_wall: float) -> list[float]:
    """Seconds from the kill until each piece of interrupted work resumed, from every workflow of the job.

    Interrupted work shows in histories as an activity attempt > 1 started after the kill (a retry on
    another worker) or a `restore` that completed after it (a session moved to another env worker).
    """
    delays: list[float] = []
    async for wf in client.list_workflows(f'RollartJobId="{job_id}" OR WorkflowId="{job_id}"'):
        history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        restores: set[int] = set()
        for ev in history.events:
            t = ev.event_time.seconds + ev.event_time.nanos / 1e9
            if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                if ev.activity_task_scheduled_event_attributes.activity_type.name == "restore":
                    restores.add(ev.event_id)
            elif ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                if ev.activity_task_started_event_attributes.attempt > 1 and t > kill_wall:
                    delays.append(t - kill_wall)
            elif ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                if ev.activity_task_completed_event_attributes.scheduled_event_id in restores and t > kill_wall:
                    delays.append(t - kill_wall)
    return delays


def _report(row: dict) -> None:
    path = os.environ.get("ROLLART_CHAOS_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")


def _trainer_ranks(stack: LocalStack) -> list[psutil.Process]:
    """The megatron rank processes the live trainer worker started."""
    [pid] = stack.live_workers(Pool.TRAINER)
    return [p for p in psutil.Process(pid).children() if "rollart.workers.trainer_rank" in " ".join(p.cmdline())]


@pytest.mark.parametrize("victim", ["cpu", "h800", "serverless", "trainer", "trainer-rank", "server", "control"])
async def test_training_survives(chaos_stack: LocalStack, chaos_client: Client, tmp_path: Path, victim: str) -> None:
    """`trainer-rank`: the job trains with the megatron backend on 2 tensor-parallel ranks, and one rank is killed."""
    _replenish(chaos_stack)
    t0 = time.monotonic()
    job_id = f"chaos-{victim}-{uuid.uuid4().hex[:6]}"
    job = chaos_stack.job
    if victim == "trainer-rank":
        job = job.model_copy(
            update={"trainer": TrainerConfig(backend="megatron", parallel={"tensor": 2}, checkpoint_every=2)}
        )
    if victim == "control":  # a run continues as new at 100 events: every step or so
        limits = TemporalLimits(history_events=1_000, continue_at=0.1)
        job = job.model_copy(update={"temporal": job.temporal.model_copy(update={"limits": limits})})
    handle = await start_training(chaos_client, job, job_id, tmp_path / job_id)
    t_step1 = await _wait_step(handle, 1)
    t_step2 = await _wait_step(handle, 2)
    normal_step_s = t_step2 - t_step1
    kill_wall = time.time()
    if victim == "server":
        t_kill = time.monotonic()
        chaos_stack.restart_server(down_s=2.0)
    elif victim == "trainer":

        def kill_trainer() -> None:
            chaos_stack.kill_worker(chaos_stack.live_workers(Pool.TRAINER)[0])
            chaos_stack.add_worker(Pool.TRAINER)  # the replacement resumes from the checkpoint and step records

        kill_wall = await _kill_mid_step(handle, kill_trainer)
        t_kill = time.monotonic() - (time.time() - kill_wall)
    elif victim == "control":
        kill_wall, run_id, killed = await _kill_control_as_a_run_nears_its_end(chaos_stack, handle)
        t_kill = time.monotonic() - (time.time() - kill_wall)
    elif victim == "trainer-rank":
        killed: list[int] = []

        def kill_rank() -> None:
            ranks = _trainer_ranks(chaos_stack)
            assert len(ranks) == 2, ranks
            ranks[1].kill()  # SIGKILL: the step fails, its retry relaunches both ranks from the last checkpoint
            killed.append(ranks[1].pid)

        kill_wall = await _kill_mid_step(handle, kill_rank, tries=1)  # between steps, the next step fails
        t_kill = time.monotonic() - (time.time() - kill_wall)
    else:
        t_kill = time.monotonic()
        chaos_stack.kill_worker(chaos_stack.live_workers(Pool(victim))[0])
    now = await _status(handle)
    t_next = await _wait_step(handle, max(now.step if now else 2, 2) + 1)
    result: TrainingResult = await asyncio.wait_for(handle.result(), 300)
    status = await handle.query("status", result_type=TrainingStatus)
    trained = await _trained_ids(chaos_client, handle)

    assert result.version == STEPS and status.step == STEPS
    assert status.ledger_balanced and result.started == (
        result.trained
        + result.dropped
        + result.filtered
        + result.failed
        + result.cancelled_in_flight
        + result.buffered_unused
    )
    assert len(trained) == len(set(trained)) == result.trained, "a trajectory was trained twice"
    if victim == "trainer-rank":
        assert len(_trainer_ranks(chaos_stack)) == 2 and not set(killed) & {p.pid for p in _trainer_ranks(chaos_stack)}
    if victim == "control":  # the run it died in continued as new on the replacement, after replaying it
        events = list((await chaos_client.get_workflow_handle(job_id, run_id=run_id).fetch_history()).events)
        assert events[-1].HasField("workflow_execution_continued_as_new_event_attributes"), events[-1]
        last_task = next(e for e in reversed(events) if e.HasField("workflow_task_completed_event_attributes"))
        assert last_task.workflow_task_completed_event_attributes.identity != killed
    if victim == "cpu":  # sessions the dead worker held (if any: timing decides) were restored, none failed
        assert result.failed == 0, f"{result.failed} trajectories failed after their env worker died"
    resumed = await _resumed_after(chaos_client, job_id, kill_wall)
    _report(
        {
            "victim": victim,
            "run_s": round(time.monotonic() - t0, 1),
            "normal_step_s": round(normal_step_s, 2),
            "kill_to_next_step_s": round(t_next - t_kill, 2),
            "interrupted_resumed": len(resumed),
            "resumed_max_s": round(max(resumed, default=0.0), 2),
            "started": result.started,
            "trained": result.trained,
            "failed": result.failed,
            "dropped": result.dropped,
            "restores": status.restores,
        }
    )
    if victim in ("trainer", "trainer-rank"):  # killed mid-step (_train_step_running): that step must have resumed
        assert resumed, f"the train_step interrupted by killing the {victim} never resumed"
