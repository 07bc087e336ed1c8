"""Sticky-session failover against a real dev server, with stand-in activities (no engine, no env process).

An env worker that is gone shows up two ways: its private queue has no poller
(schedule-to-start timeout) or it answers SessionLost. Either way the episode
(or the lockstep group) must call `restore` on the shared cpu queue with its
seed, recorded actions and last observations, move to the new queue and go on.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.testing import WorkflowEnvironment

from rollart.contracts.rollouts import GroupRolloutInput, GroupSeed, TrajectoryInput, TrajectoryResult
from rollart.contracts.training import TrainingInput, TrainingResult, TrainingStatus
from rollart.infra.temporal.search_attributes import ensure_registered
from rollart.spec.config import JobSpec, TrainingConfig
from rollart.spec.pools import Pool, queue_name
from tests.support.standins import StandIns, reward_per_turn, standin_workers
from tests.support.tasks import frozenlake_task, with_queue_prefix

pytestmark = pytest.mark.orchestration


def envs(**config: object) -> StandIns:
    """Stand-ins whose reward counts turns, so a restored episode shows it kept the turns before the loss."""
    return StandIns(**{"score": reward_per_turn, **config})


async def run_trajectory(env: WorkflowEnvironment, e: StandIns) -> TrajectoryResult:
    """One 5-turn-at-most episode of seed 7 on the stand-ins, on their queues."""
    inp = TrajectoryInput(task=frozenlake_task(max_turns=5), seed=7, queue_prefix=e.prefix)
    async with standin_workers(env.client, e):
        return await env.client.execute_workflow(
            "TrajectoryWorkflow",
            inp,
            id=f"fo-{uuid.uuid4().hex[:8]}",
            task_queue=queue_name(Pool.CONTROL, e.prefix),
            result_type=TrajectoryResult,
        )


async def test_a_session_lost_mid_episode_is_restored_and_the_episode_goes_on(
    bare_env: WorkflowEnvironment, queue_prefix: str
) -> None:
    e = envs(prefix=queue_prefix, turns=3, lose_after=2)
    r = await run_trajectory(bare_env, e)
    assert r.status == "completed" and r.turns == 3 and r.reward == 3.0 and r.restores == 1
    [restore] = e.inputs("restore")
    assert restore.seed == 7 and restore.actions == [["R", "R"]] and restore.observations == ["2"]
    assert r.env_worker == "w2"


async def test_a_dead_workers_queue_is_detected_by_schedule_to_start(
    bare_env: WorkflowEnvironment, queue_prefix: str
) -> None:
    e = envs(prefix=queue_prefix, turns=2, dead_resets=True)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    r = await run_trajectory(bare_env, e)
    assert r.status == "completed" and r.turns == 2 and r.restores == 1
    assert e.inputs("restore")[0].actions == [[]] and e.inputs("restore")[0].observations == ["0"]
    # detected within the handle's sticky_start_s (the stand-in worker's: 1 s), not the step's minutes. Real
    # seconds: no time-skipping server skips a schedule-to-start timeout while the task waits in its queue.
    assert loop.time() - t0 < 8


async def test_a_lockstep_group_restores_all_its_members(bare_env: WorkflowEnvironment, queue_prefix: str) -> None:
    e = envs(prefix=queue_prefix, turns=3, lose_after=1)
    task = frozenlake_task(max_turns=5, group_size=3, rollout_unit="group")
    inp = GroupRolloutInput(task=task, groups=[GroupSeed(group_id="g", seed=4)], queue_prefix=queue_prefix)
    async with standin_workers(bare_env.client, e):
        results = await bare_env.client.execute_workflow(
            "GroupRolloutWorkflow",
            inp,
            id=f"fo-{uuid.uuid4().hex[:8]}",
            task_queue=queue_name(Pool.CONTROL, queue_prefix),
            result_type=list[TrajectoryResult],
        )
    assert [r.status for r in results] == ["completed"] * 3 and all(r.turns == 3 and r.restores == 1 for r in results)
    [restore] = e.inputs("restore")
    assert restore.owner_id == "g" and restore.actions == [["R"]] * 3 and restore.observations == ["1"] * 3


async def test_training_through_env_worker_loss_trains_every_trajectory_once(
    bare_env: WorkflowEnvironment, queue_prefix: str
) -> None:
    await ensure_registered(bare_env.client)
    e = envs(prefix=queue_prefix, turns=2, lose_after=1)  # every session is lost after its first step
    spec = JobSpec(
        name="fo",
        tasks=[frozenlake_task(group_size=2, max_turns=3)],
        training=TrainingConfig(steps=3, batch_size=4, async_bound=1),
    )
    spec = with_queue_prefix(spec, queue_prefix)
    job_id = f"fo-{uuid.uuid4().hex[:8]}"
    async with standin_workers(bare_env.client, e):
        handle = await bare_env.client.start_workflow(
            "TrainingWorkflow",
            TrainingInput(job=spec, job_id=job_id, run_dir="/tmp/unused"),
            id=job_id,
            task_queue=queue_name(Pool.CONTROL, queue_prefix),
            result_type=TrainingResult,
        )
        result = await asyncio.wait_for(handle.result(), 300)
        status = await handle.query("status", result_type=TrainingStatus)
    assert result.version == 3 and result.failed == 0 and status.ledger_balanced
    assert len(e.trained_ids) == len(set(e.trained_ids)) == result.trained == 12
    assert status.restores >= result.trained  # every trained trajectory moved once
