"""Training with `store: mooncake` on the real local stack: as `local`; the master killed and restarted mid-run.

The stack starts its own `mooncake_master` and store keeper on free loopback
ports (stopped by PID with the stack). Weights reach vLLM through Mooncake
bit-exactly: on-policy steps see the trainer's logprobs equal the engine's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.client import Client

from rollart.contracts.training import TrainingResult
from rollart.infra.local.devserver import free_port
from rollart.infra.store.mooncake import MooncakeStore
from rollart.infra.store.payload import MirroredStore, StoreUnavailable, open_store
from rollart.infra.store.weights import PublishedWeights, latest_weights, manifest_key, read_manifest
from rollart.infra.temporal.connection import connect
from rollart.spec.config import JobSpec, MooncakeConfig, StoreConfig
from rollart.spec.pools import Pool
from rollart.workers.local_stack import LocalStack
from tests.support.training_runs import run_job
from tests.support.weights import latest_tensors, publish_tensors

pytestmark = pytest.mark.integration

POOLS = [Pool.CONTROL, Pool.CPU, Pool.H800, Pool.SERVERLESS, Pool.TRAINER]
LEASE_S = 1.0  # how long a read holds an object against removal: short, so retired versions go soon


def _stack(job: JobSpec, home: Path) -> LocalStack:
    return LocalStack(job=job, pools=POOLS, home=home, port=free_port(), ui_port=None)


@pytest.fixture(scope="module")
def mc_job(stack_job: JobSpec, tmp_path_factory: pytest.TempPathFactory) -> JobSpec:
    home = tmp_path_factory.mktemp("mcstack")
    store = StoreConfig(
        kind="mooncake",
        path=home / "store",
        fallback="local",
        mooncake=MooncakeConfig(keeper_segment_mib=256, retry_after_s=2.0, lease_s=LEASE_S),
    )
    return stack_job.model_copy(update={"store": store})


@pytest.fixture(scope="module")
def mc_stack(mc_job: JobSpec) -> Iterator[LocalStack]:
    s = _stack(mc_job, mc_job.store.path.parent)
    s.start(timeout_s=300)
    yield s
    s.stop()


@pytest.fixture(scope="module")
async def mc_client(mc_stack: LocalStack) -> AsyncIterator[Client]:
    yield await connect(mc_stack.temporal, mc_stack.store)


def _counts(r: TrainingResult) -> tuple[int, ...]:
    return (r.steps, r.version, r.started, r.trained, r.dropped, r.failed)


async def test_mooncake_training_matches_local(
    mc_stack: LocalStack, mc_client: Client, client: Client, stack: LocalStack, tmp_path: Path
) -> None:
    """Bound 0 (deterministic admission): the same versions and trajectory counts with either store (the
    session stack's is a local directory)."""
    job, result, status, _ = await run_job(mc_client, mc_stack.job, tmp_path / "mc", async_bound=0)
    assert result.version == 3 and [r.step for r in status.history] == [0, 1, 2] and status.ledger_balanced
    assert all(r.train["logprob_diff_behav"] < 1e-4 for r in status.history)  # weights arrived bit-exact
    assert all("publish_s" in r.train for r in status.history)
    store = open_store(mc_stack.store)
    assert isinstance(store, MirroredStore) and isinstance(store.cache, MooncakeStore)
    ref = latest_weights(store.cache, job.name)  # served by Mooncake itself, not the fallback
    assert ref is not None and ref.version == 3
    assert store.cache.exists(manifest_key(job.name, 3)) and store.cache.exists(manifest_key(job.name, 2))
    # v1's buckets may outlive v3's publish: Mooncake leases an object for LEASE_S after each read, and the
    # generator streamed them moments before. Once the lease is over, a publish sweeps every version ≤ v − keep.
    old = {
        v: read_manifest(store.cache, manifest_key(job.name, v))
        for v in (1, 2)
        if store.cache.exists(manifest_key(job.name, v))
    }
    retired = [k for m in old.values() for k in (*(b.key for b in m.buckets), manifest_key(job.name, m.version))]
    tensors, version = latest_tensors(store.cache, job.name), 4
    deadline = time.monotonic() + 20 * LEASE_S
    while True:
        publish_tensors(store.cache, job.name, version, tensors)
        version += 1
        if not any(map(store.cache.exists, retired)) or time.monotonic() > deadline:
            break
        await asyncio.sleep(LEASE_S * 1.5)  # past the lease that reading (and asking about) them renewed
    assert retired and not any(map(store.cache.exists, retired))
    assert store.cache.exists(manifest_key(job.name, version - 1))
    assert latest_weights(store.cache, job.name).version == version - 1

    assert stack.store.kind == "local"
    _, local_result, local_status, _ = await run_job(client, stack.job, tmp_path / "local", async_bound=0)
    assert _counts(local_result) == _counts(result)
    assert [(r.step, r.version, r.samples) for r in local_status.history] == [
        (r.step, r.version, r.samples) for r in status.history
    ]


def _steps_written(tmp_path: Path) -> int:
    """Steps the running job has written to its metrics.jsonl (0 before its run dir exists)."""
    run_dir = next(iter(tmp_path.glob("e2e-*")), None)
    metrics = run_dir / "metrics.jsonl" if run_dir else None
    return len(metrics.read_text().splitlines()) if metrics and metrics.is_file() else 0


@pytest.mark.chaos  # kills and restarts the master
async def test_master_killed_mid_run_falls_back_to_local_then_serves_again_once_restarted(
    mc_stack: LocalStack, mc_client: Client, tmp_path: Path
) -> None:
    """`fallback: local`: the master dies after the first step and is restarted (empty) after the third.

    Every step trains a full batch and none fails: the run carries on from the local copy, and once the
    master is back (its keeper mounts again; the workers' clients reconnect) new versions go to Mooncake.
    """
    service = mc_stack.mooncake
    assert service is not None
    timeline: list[str] = []

    async def kill_then_restart() -> None:
        while _steps_written(tmp_path) < 1:
            await asyncio.sleep(0.2)
        service.kill_master()
        t0 = time.monotonic()
        timeline.append("  0.0 s  master SIGKILLed after step 0")
        while _steps_written(tmp_path) < 3:
            await asyncio.sleep(0.2)
        service.start_master()
        timeline.append(f"{time.monotonic() - t0:5.1f} s  master restarted (empty) after step 2")

    chaos = asyncio.create_task(kill_then_restart())
    job, result, status, _ = await run_job(mc_client, mc_stack.job, tmp_path, async_bound=1, steps=6)
    print("\n" + "\n".join(timeline))
    assert chaos.done() and len(timeline) == 2, "the master was not killed and restarted mid-run"
    await chaos
    assert result.version == 6 and [r.step for r in status.history] == list(range(6))
    assert status.ledger_balanced
    # no trajectory failed while the job ran (those still in flight when it ends are cancelled, whatever the store)
    assert [r.failed for r in status.history] == [0] * 6 and [r.samples for r in status.history] == [8] * 6
    on_policy = [r for r in status.history if r.staleness_max == 0]
    assert all(r.train["logprob_diff_behav"] < 1e-4 for r in on_policy)  # weights came whole, from either store
    store = open_store(mc_stack.store)
    assert isinstance(store, MirroredStore) and isinstance(store.cache, MooncakeStore)
    ref = await _latest_from_mooncake(store.cache, job.name)  # the restarted master serves the versions published since
    assert ref is not None and ref.version == 6


async def _latest_from_mooncake(
    cache: MooncakeStore, job_name: str, timeout_s: float = 15.0
) -> PublishedWeights | None:
    """The job's latest weights as Mooncake serves them. This process's client last spoke to the killed master:
    its first call after the restart fails unreachable, and it reconnects by itself (as the workers' clients did)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return latest_weights(cache, job_name)
        except StoreUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1.0)
