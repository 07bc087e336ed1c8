"""Worker liveness from Temporal's worker heartbeats (infra/temporal/liveness.py), against a real dev server."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from temporalio import activity
from temporalio.api.enums.v1 import WorkerStatus
from temporalio.api.worker.v1 import WorkerHeartbeat
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from rollart.infra.temporal.connection import connect
from rollart.infra.temporal.liveness import alive, queue_liveness
from rollart.spec.config import StoreConfig, TemporalConfig


def beat(age_s: float, interval_s: float, status: int = WorkerStatus.WORKER_STATUS_RUNNING) -> WorkerHeartbeat:
    at = Timestamp()
    at.FromSeconds(int(1000.0 - age_s))
    return WorkerHeartbeat(
        status=status, heartbeat_time=at, elapsed_since_last_heartbeat=Duration(seconds=int(interval_s))
    )


def test_a_worker_is_alive_until_it_misses_two_of_its_own_heartbeats() -> None:
    assert alive(beat(age_s=4, interval_s=5), 1000.0, 5.0)
    assert alive(beat(age_s=15, interval_s=5), 1000.0, 5.0)  # 2 missed + 5 s of grace
    assert not alive(beat(age_s=16, interval_s=5), 1000.0, 5.0)
    assert alive(beat(age_s=100, interval_s=60), 1000.0, 5.0)  # a slower heartbeat is judged by its own interval
    assert not alive(beat(age_s=16, interval_s=0), 1000.0, 5.0)  # a first heartbeat (gap 0): the deployment's interval
    assert not alive(beat(age_s=1, interval_s=5, status=WorkerStatus.WORKER_STATUS_SHUTDOWN), 1000.0, 5.0)


@activity.defn(name="noop")
async def noop() -> None:
    return None


@pytest.mark.orchestration
async def test_a_running_worker_heartbeats_on_its_queue_and_stops_when_shut_down(
    bare_env: WorkflowEnvironment, queue_prefix: str, tmp_path: Path
) -> None:
    """rollart's clients send a heartbeat every `worker_heartbeat_s`; the queue's liveness reads them."""
    temporal = TemporalConfig(address=bare_env.client.service_client.config.target_host, worker_heartbeat_s=1.0)
    client = await connect(temporal, StoreConfig(path=tmp_path / "store"))
    queue = f"{queue_prefix}liveness"
    before = await queue_liveness(client, queue, 1.0)
    assert before is not None and before.alive == 0 and before.last_heartbeat_s_ago is None
    async with Worker(client, task_queue=queue, activities=[noop]):
        deadline = time.monotonic() + 20
        while (live := await queue_liveness(client, queue, 1.0)) is None or live.alive == 0:
            assert time.monotonic() < deadline, "no heartbeat within 20 s"
            await asyncio.sleep(0.5)
        assert live.last_heartbeat_s_ago is not None and live.last_heartbeat_s_ago < 5
    after = await queue_liveness(client, queue, 1.0)  # a worker that shut down says so in its last heartbeat
    assert after is not None and after.alive == 0
