"""Session affinity against a real dev server, with two stand-in engine workers on one pool (no vLLM).

Each stand-in engine polls the pool's shared queue and its own private queue, as a real generation worker
does. A trajectory's later turns must go to the private queue of the engine that served its first; an
engine that is stopped (killed) or refuses (busy) sends them to the shared queue, and nothing fails. A
single-turn wave is shared by the engines the control worker sees alive (worker heartbeats).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict

import pytest
from temporalio.testing import WorkflowEnvironment

from rollart.activities.queues import QueueActivities
from rollart.contracts.generation import LiveEnginesInput
from rollart.contracts.rollouts import GroupRolloutInput, GroupSeed, TrajectoryInput, TrajectoryResult
from rollart.contracts.training import TrainingInput, TrainingResult, TrainingStatus
from rollart.infra.temporal.search_attributes import ensure_registered
from rollart.spec.config import AffinityConfig, EngineConfig, JobSpec, TrainingConfig
from rollart.spec.pools import Pool, queue_name
from tests.support.standins import StandIns, standin_workers
from tests.support.tasks import frozenlake_task, with_queue_prefix
from tests.support.training_plans import arithmetic_task

pytestmark = pytest.mark.orchestration

QUICK = AffinityConfig(start_wait_s=1.0)  # a pinned turn left waiting 1 s goes to the shared queue


def turns_by_trajectory(e: StandIns) -> dict[str, list[tuple[str, str]]]:
    """Each trajectory's generate calls in order: (the queue it went to, the engine that served it)."""
    out: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for c in e.called("generate"):
        out[c.inp.data_key.split("/")[2]].append((c.queue, c.engine))
    return out


async def play(env: WorkflowEnvironment, e: StandIns, n: int, turns: int) -> list[TrajectoryResult]:
    task = frozenlake_task(max_turns=turns + 1)
    handles = [
        await env.client.start_workflow(
            "TrajectoryWorkflow",
            TrajectoryInput(task=task, seed=i, queue_prefix=e.prefix, affinity=QUICK),
            id=f"aff-{uuid.uuid4().hex[:8]}",
            task_queue=queue_name(Pool.CONTROL, e.prefix),
            result_type=TrajectoryResult,
        )
        for i in range(n)
    ]
    return list(await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 120))


async def test_later_turns_go_to_the_engine_that_served_the_first(
    bare_env: WorkflowEnvironment, queue_prefix: str
) -> None:
    e = StandIns(prefix=queue_prefix, turns=4, engines=("e1", "e2"))
    async with standin_workers(bare_env.client, e):
        results = await play(bare_env, e, n=6, turns=4)
    assert [r.status for r in results] == ["completed"] * 6 and all(r.engine_moves == 0 for r in results)
    for tid, turns in turns_by_trajectory(e).items():
        (first_queue, first), later = turns[0], turns[1:]
        assert first_queue == queue_name(Pool.H800, queue_prefix), tid
        assert later == [(e.engine_queue(first), first)] * 3, f"{tid}: {turns}"
    assert {r.engine_worker for r in results} <= {"e1", "e2"}


@pytest.mark.chaos
async def test_a_killed_engines_trajectories_go_on_elsewhere(bare_env: WorkflowEnvironment, queue_prefix: str) -> None:
    """e2 is stopped mid-rollout: turns pinned to it wait out the start wait (or its in-flight one is retried), go
    to the shared queue, and e1 serves them from then on; every trajectory completes. In the chaos tier: a turn
    the stopped worker had just polled is retried only after GENERATE's 60 s heartbeat timeout, so this takes 3 s
    or 63 s (about one run in four), by a race no test can steer."""
    e = StandIns(prefix=queue_prefix, turns=6, engines=("e1", "e2"), turn_delay_s=0.2)
    async with standin_workers(bare_env.client, e) as pool:
        rollout = asyncio.ensure_future(play(bare_env, e, n=8, turns=6))
        deadline = time.monotonic() + 60
        while sum(c.engine == "e2" and c.queue == e.engine_queue("e2") for c in e.called("generate")) < 3:
            assert time.monotonic() < deadline and not rollout.done(), "e2 never served a pinned turn"
            await asyncio.sleep(0.05)
        await pool.stop_engine("e2")
        stopped_at = len(e.called("generate"))
        results = await rollout
    assert [r.status for r in results] == ["completed"] * 8 and all(r.turns == 6 for r in results)
    assert all(c.engine == "e1" for c in e.called("generate")[stopped_at:])
    moved = [r for r in results if r.engine_moves]
    assert moved and all(r.engine_worker == "e1" for r in moved)


async def test_a_busy_engine_sends_pinned_turns_to_the_shared_queue(
    bare_env: WorkflowEnvironment, queue_prefix: str
) -> None:
    """Both engines refuse every turn that comes through their private queues (EngineBusy, as with too many
    waiting): each such turn is played again from the shared queue at once, by whichever engine takes it there."""
    e = StandIns(prefix=queue_prefix, turns=3, engines=("e1", "e2"), busy_engines={"e1", "e2"})
    async with standin_workers(bare_env.client, e):
        results = await play(bare_env, e, n=6, turns=3)
    assert [r.status for r in results] == ["completed"] * 6
    shared = queue_name(Pool.H800, queue_prefix)
    for tid, turns in turns_by_trajectory(e).items():  # a first turn, then (its engine's queue, shared) per turn
        assert [q for q, _ in turns[1:]] == [e.engine_queue(turns[0][1]), shared, e.engine_queue(turns[2][1]), shared]
        assert turns[0][0] == shared, tid


async def wait_for_live_engines(client, prefix: str, n: int) -> list[str]:  # type: ignore[no-untyped-def]
    """The control worker's view (worker heartbeats) once it lists `n` engines of h800."""
    live, deadline = QueueActivities(client), time.monotonic() + 40
    while len(queues := (await live.live_engines(LiveEnginesInput(pool="h800", queue_prefix=prefix))).queues) < n:
        assert time.monotonic() < deadline, f"only {queues} heartbeating after 40 s"
        await asyncio.sleep(0.5)
    return queues


async def test_a_single_turn_wave_is_shared_by_the_live_engines(
    bare_env: WorkflowEnvironment, queue_prefix: str
) -> None:
    e = StandIns(prefix=queue_prefix, engines=("e1", "e2"))
    task = arithmetic_task(group_size=4, generate_pool="h800")
    groups = [GroupSeed(group_id=f"g{i}", seed=i) for i in range(6)]
    async with standin_workers(bare_env.client, e):
        assert await wait_for_live_engines(bare_env.client, queue_prefix, 2) == [
            e.engine_queue("e1"),
            e.engine_queue("e2"),
        ]
        results = await bare_env.client.execute_workflow(
            "GroupRolloutWorkflow",
            GroupRolloutInput(task=task, groups=groups, queue_prefix=queue_prefix),
            id=f"aff-{uuid.uuid4().hex[:8]}",
            task_queue=queue_name(Pool.CONTROL, queue_prefix),
            result_type=list[TrajectoryResult],
        )
    batches = e.called("generate_batch")
    assert sorted((c.queue, c.engine, len(c.inp.prompts)) for c in batches) == [
        (e.engine_queue("e1"), "e1", 3),
        (e.engine_queue("e2"), "e2", 3),
    ]
    assert [r.status for r in results] == ["completed"] * 24


async def test_training_through_an_engine_loss_loses_nothing(bare_env: WorkflowEnvironment, queue_prefix: str) -> None:
    """A trajectory-mode job on two engines, one stopped after the first step: 0 failed, the ledger balances, and
    the job's status names the engines and the admission cap."""
    await ensure_registered(bare_env.client)
    e = StandIns(prefix=queue_prefix, turns=3, engines=("e1", "e2"), turn_delay_s=0.05)
    spec = JobSpec(
        name="aff",
        tasks=[frozenlake_task(group_size=2, max_turns=4)],
        training=TrainingConfig(steps=4, batch_size=4, async_bound=1),
        engine=EngineConfig(affinity=QUICK),
    )
    job_id = f"aff-{uuid.uuid4().hex[:8]}"
    async with standin_workers(bare_env.client, e) as pool:
        handle = await bare_env.client.start_workflow(
            "TrainingWorkflow",
            TrainingInput(job=with_queue_prefix(spec, queue_prefix), job_id=job_id, run_dir="/tmp/unused"),
            id=job_id,
            task_queue=queue_name(Pool.CONTROL, queue_prefix),
            result_type=TrainingResult,
        )
        deadline = time.monotonic() + 60
        while not e.called("train_step"):
            assert time.monotonic() < deadline, "no train step within 60 s"
            await asyncio.sleep(0.05)
        await pool.stop_engine("e2")
        result = await asyncio.wait_for(handle.result(), 120)
        status = await handle.query("status", result_type=TrainingStatus)
    assert result.version == 4 and result.failed == 0 and status.ledger_balanced
    assert len(e.trained_ids) == len(set(e.trained_ids)) == result.trained
    assert status.admission_cap == 8 and status.in_flight_limit == 8  # no pressure reported: the bound's cap
    assert set(status.engines) <= {"e1", "e2"} and status.engines
