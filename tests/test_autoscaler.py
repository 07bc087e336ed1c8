"""The local autoscaler against a real dev server and real `rollart worker --pool serverless` processes.

Floods the serverless queue with slow rewards: workers start (never more than max), a worker
killed with SIGKILL mid-activity has its activities retried on another one, and once the
queue drains the pool goes back to its minimum (0). Prints the reaction times it measured.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import Client
from temporalio.worker import Worker

from rollart.infra.local.devserver import DevServer, free_port
from rollart.infra.temporal.connection import connect
from rollart.infra.temporal.worker_tuning import workflow_runner
from rollart.spec.config import StoreConfig, TemporalConfig, WorkerTuning
from rollart.spec.pools import ElasticPoolConfig, Pool
from rollart.workers.autoscaler import Autoscaler, WorkerProcesses
from rollart.workers.settings import WorkerSettings
from tests.support.fanout import FanOutRewards
from tests.support.paths import REPO

pytestmark = pytest.mark.integration

CFG = ElasticPoolConfig(
    min_workers=0,
    max_workers=3,
    max_concurrent_activities=2,
    scale_up_cooldown_s=3,
    scale_down_cooldown_s=5,
    poll_interval_s=1,
)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[DevServer, StoreConfig]]:
    with DevServer(db_file=tmp_path / "t.db", port=free_port(), ui_port=None) as s:
        yield s, StoreConfig(path=tmp_path / "store")


def _pid_of(identity: str) -> int:
    """Worker identities are `<pool>-<host>-<pid>-<random>`."""
    return int(identity.rsplit("-", 2)[1])


async def _running_on(client: Client, workflow_id: str) -> list[str]:
    desc = await client.get_workflow_handle(workflow_id).describe()
    return [
        a.last_worker_identity
        for a in desc.raw_description.pending_activities
        if a.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
    ]


async def _wait(cond: Callable[[], Awaitable[bool]], timeout_s: float, what: str, every_s: float = 0.25) -> None:
    t0 = time.monotonic()
    while not await cond():
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"not within {timeout_s}s: {what}")
        await asyncio.sleep(every_s)


@pytest.mark.chaos  # kills a worker mid-activity
async def test_scales_up_with_backlog_retries_a_killed_workers_activity_and_drains_to_min(
    server: tuple[DevServer, StoreConfig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    srv, store = server
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the workers import tests.support.rewards
    temporal = TemporalConfig(address=srv.address)
    settings = WorkerSettings(pool=Pool.SERVERLESS, temporal=temporal, store=store, max_concurrent_activities=2)
    scaler = Autoscaler(cfg=CFG, procs=WorkerProcesses(settings, tmp_path / "home"))
    client = await connect(temporal, store)
    peak = 0

    async def sample_peak() -> None:
        nonlocal peak
        while True:
            peak = max(peak, len(scaler.procs.serving))
            await asyncio.sleep(0.1)

    scaler.start_in_thread(ready_timeout_s=10)
    sampler = asyncio.create_task(sample_peak())
    try:
        assert scaler.procs.serving == []  # min 0: nothing runs before there is work
        async with Worker(
            client,
            task_queue="fanout",
            workflows=[FanOutRewards],
            workflow_runner=workflow_runner(WorkerTuning(sandbox="strict")),
        ):
            wf_id = f"fanout-{uuid.uuid4().hex[:6]}"
            t_flood = time.monotonic()
            handle = await client.start_workflow(
                FanOutRewards.run, args=[12, "tests.support.rewards:slow", 3.0], id=wf_id, task_queue="fanout"
            )

            async def a_worker_ready() -> bool:
                return scaler.procs.ready_count() >= 1

            await _wait(a_worker_ready, 90, "a serverless worker ready after the flood")
            first_ready_s = time.monotonic() - t_flood
            running: list[str] = []

            async def a_reward_running() -> bool:
                nonlocal running
                running = await _running_on(client, wf_id)
                return bool(running)

            await _wait(a_reward_running, 60, "a reward running on a worker")
            victim = _pid_of(running[0])
            assert victim in scaler.procs.pids()
            os.kill(victim, signal.SIGKILL)
            t_kill = time.monotonic()
            results = await asyncio.wait_for(handle.result(), 120)
            after_kill_s = time.monotonic() - t_kill
        assert len(results) == 12 and all(r.success for r in results)
        history = await handle.fetch_history()
        retried = [
            e.activity_task_started_event_attributes
            for e in history.events
            if e.HasField("activity_task_started_event_attributes")
            and e.activity_task_started_event_attributes.attempt > 1
        ]
        assert retried, "no activity was retried after the kill"
        assert all(_pid_of(a.identity) != victim for a in retried)  # retried on another worker
        assert any(e.kind == "exit" and e.pid == victim and "died" in e.detail for e in scaler.events)

        t_drained = time.monotonic()

        async def back_at_min() -> bool:
            return scaler.target == 0 and not scaler.procs.serving and not scaler.procs.draining

        await _wait(back_at_min, 120, "the pool back at min (0) after the queue drained", every_s=0.5)
        down_s = time.monotonic() - t_drained
        decisions = [d for d in scaler.decisions if d.changed]
        assert max(d.target for d in scaler.decisions) <= CFG.max_workers and peak <= CFG.max_workers
        assert decisions[0].target > decisions[0].before and decisions[0].backlog > 0
        up = next(e for e in scaler.events if e.kind == "decision")
        print(
            f"\nautoscaler reaction: flood → scale-up decision {up.at - t_flood:.1f}s, → first worker ready "
            f"{first_ready_s:.1f}s; the killed worker's rewards done {after_kill_s:.1f}s after the kill "
            f"(heartbeat timeout 10s); drained → back at 0 workers in {down_s:.1f}s; peak {peak} workers; "
            "decisions: " + "; ".join(d.describe() for d in decisions)
        )
    finally:
        sampler.cancel()
        scaler.stop_thread()
    assert scaler.procs.serving == [] and scaler.procs.draining == []
