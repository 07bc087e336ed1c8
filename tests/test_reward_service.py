"""Reward-as-a-Service: placement (serverless | colocated), elastic-pool config, reward models loaded once.

Routing is checked against a real dev server with stand-in activities; the reward model and
the config errors in-process.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from pydantic import ValidationError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from rollart.activities.reward import RewardActivities
from rollart.activities.rewards.model_based import RewardModel, render
from rollart.contracts.activities import RewardBatchInput, RewardInput, Transcript, TurnRecord
from rollart.contracts.rollouts import GroupRolloutInput, GroupSeed, TrajectoryInput
from rollart.spec.checks import JobCheckError, check_job_components
from rollart.spec.config import JobSpec, TaskSpec, resolve
from rollart.spec.pools import Pool, queue_name
from rollart.spec.registry import lookup_reward
from rollart.workers.settings import WorkerSettings
from rollart.workflows import GroupRolloutWorkflow, TrajectoryWorkflow
from tests.support.paths import REPO
from tests.support.rewards import CountingModel
from tests.support.standins import StandIns, standin_workers
from tests.support.tasks import frozenlake_task

ENV = ActivityEnvironment()


def won(turns: int = 2) -> Transcript:
    return Transcript(
        task="t",
        seed=0,
        turns=[
            TurnRecord(observation=f"obs {i}", action="R", info={"success": i == turns - 1, "valid": True})
            for i in range(turns)
        ],
    )


# ---------------------------------------------------------------- the job spec


def test_placement_picks_the_reward_queue() -> None:
    assert frozenlake_task().reward_placement == "serverless"
    assert frozenlake_task().reward_queue == "serverless"
    assert frozenlake_task(reward_placement="colocated", generate_pool="h20").reward_queue == "h20"
    with pytest.raises(ValidationError, match="reward_placement"):
        frozenlake_task(reward_placement="gpu")


def test_unknown_or_fixed_pools_in_a_job_are_clear_errors() -> None:
    tasks = [frozenlake_task().model_dump()]
    with pytest.raises(ValidationError, match=r"pools.gpu: a pool that is not one of the defaults \(control, cpu,"):
        JobSpec.model_validate({"tasks": tasks, "pools": {"gpu": {"max_workers": 2}}})
    with pytest.raises(ValidationError, match=r"max_workers: generation pools have a fixed set of workers; only re"):
        JobSpec.model_validate({"tasks": tasks, "pools": {"h800": {"max_workers": 2}}})
    assert JobSpec.model_validate({"tasks": tasks, "pools": {"h800": {}}}).pools["h800"].role == "generation"
    with pytest.raises(ValidationError, match=r"min_workers \(3\) exceeds max_workers \(2\)"):
        JobSpec.model_validate({"tasks": tasks, "pools": {"serverless": {"min_workers": 3, "max_workers": 2}}})


def test_a_reward_on_a_pool_without_workers_is_a_clear_error() -> None:
    none = {"serverless": {"min_workers": 0, "max_workers": 0}}
    with pytest.raises(
        ValidationError,
        match=r"tasks.0 \(frozenlake\) places its reward on pool 'serverless', but "
        r"pools.serverless.max_workers is 0",
    ):
        resolve(JobSpec.model_validate({"tasks": [frozenlake_task().model_dump()], "pools": none}))
    colocated = frozenlake_task(reward_placement="colocated").model_dump()
    job = resolve(JobSpec.model_validate({"tasks": [colocated], "pools": none}))  # colocated: no serverless worker
    assert job.elastic(Pool.SERVERLESS).max_workers == 0 and job.colocates_rewards(Pool.H800)


def test_only_jobs_with_serverless_rewards_need_the_serverless_pool() -> None:
    from rollart.workers.local_stack import pools_for_job

    assert Pool.SERVERLESS in pools_for_job(JobSpec(tasks=[frozenlake_task()]))
    colocated = JobSpec(tasks=[frozenlake_task(reward_placement="colocated")])
    assert pools_for_job(colocated) == [Pool.CONTROL, Pool.CPU, Pool.H800]


def test_worker_settings_follow_the_placement() -> None:
    job = JobSpec(
        tasks=[frozenlake_task(reward_placement="colocated", generate_pool="h20")],
        pools={"serverless": {"max_concurrent_activities": 3}},
    )
    assert WorkerSettings.from_job(job, Pool.H20).serve_rewards
    assert not WorkerSettings.from_job(job, Pool.H800).serve_rewards
    assert WorkerSettings.from_job(job, Pool.SERVERLESS).max_concurrent_activities == 3


def test_job_check_rejects_args_a_reward_cannot_take() -> None:
    def check(**task: object) -> None:
        check_job_components(JobSpec(tasks=[frozenlake_task(**task)]))

    check(reward="reward_model", reward_args={"layers": 1, "hidden": 16, "heads": 2})
    with pytest.raises(JobCheckError, match="takes no reward_args"):
        check(reward="success", reward_args={"layers": 1})
    with pytest.raises(JobCheckError, match="hiddn"):
        check(reward="reward_model", reward_args={"hiddn": 16})
    with pytest.raises(JobCheckError, match=r"multiple of heads"):
        check(reward="reward_model", reward_args={"hidden": 30, "heads": 4})
    check(reward="tests.support.rewards:beside_generation")  # declared serverless=False: it goes beside generation
    assert frozenlake_task(reward="tests.support.rewards:beside_generation").reward_queue == "h800"
    check(reward="tests.support.rewards:beside_generation", reward_placement="colocated")


# ---------------------------------------------------------------- the reward model


def test_reward_model_is_declared_serverless_and_loads_lazily() -> None:
    entry = lookup_reward("reward_model")
    assert entry.is_model and entry.serverless and entry.pool == Pool.SERVERLESS
    assert entry.fn is RewardModel
    assert lookup_reward("tests.support.rewards:beside_generation").pool is None


def test_reward_model_scores_are_deterministic_and_mix_with_the_rule() -> None:
    args = {"hidden": 32, "layers": 1, "heads": 2, "max_len": 64, "weight": 0.5}
    a, b = RewardModel.from_args(**args), RewardModel.from_args(**args)
    t = won()
    ra, rb = a(t), b(t)
    assert ra == rb  # same args, same weights, same score
    assert ra.success and 1.1 <= ra.value <= 1.6  # success (1) + valid bonus (0.1) + 0.5 × score in (0, 1)
    other = RewardModel.from_args(**{**args, "seed": 1})(t)
    assert other.value != ra.value
    assert "obs 1\n> R\n" in render(t)


async def test_reward_models_load_once_per_worker_and_args_even_under_concurrency() -> None:
    CountingModel.loaded = 0
    acts = RewardActivities()
    name = "tests.support.rewards:CountingModel"
    results = await asyncio.gather(
        *(
            ENV.run(acts.reward, RewardInput(reward=name, transcript=won(3), reward_args={"bias": 0.5}))
            for _ in range(6)
        )
    )
    assert [r.value for r in results] == [3.5] * 6
    assert CountingModel.loaded == 1 and acts.loads == 1
    batch = await ENV.run(
        acts.reward_batch, RewardBatchInput(reward=name, transcripts=[won(1), won(2)], reward_args={"bias": 0.5})
    )
    assert [r.value for r in batch] == [1.5, 2.5] and CountingModel.loaded == 1
    await ENV.run(acts.reward, RewardInput(reward=name, transcript=won(1), reward_args={"bias": 1.0}))
    assert CountingModel.loaded == 2  # other args, another model


async def test_bad_reward_args_fail_without_retry() -> None:
    acts = RewardActivities()
    with pytest.raises(ApplicationError) as err:
        await ENV.run(acts.reward, RewardInput(reward="reward_model", transcript=won(), reward_args={"layers": 0}))
    assert err.value.type == "InvalidInput" and err.value.non_retryable and "layers" in err.value.message
    with pytest.raises(ApplicationError) as err:
        await ENV.run(acts.reward, RewardInput(reward="reward_model", transcript=won(), reward_args={"base": "nope"}))
    assert err.value.type == "InvalidInput" and "unknown reward 'nope'" in err.value.message
    with pytest.raises(ApplicationError) as err:
        await ENV.run(acts.reward, RewardInput(reward="success", transcript=won(), reward_args={"x": 1}))
    assert err.value.type == "InvalidInput" and "takes no reward_args" in err.value.message


# ---------------------------------------------------------------- routing (stand-in activities)


@pytest.mark.orchestration
@pytest.mark.parametrize(("placement", "pool"), [("serverless", "serverless"), ("colocated", "h800")])
async def test_trajectory_reward_goes_where_the_task_places_it(
    bare_env: WorkflowEnvironment, queue_prefix: str, placement: str, pool: str
) -> None:
    s = StandIns(prefix=queue_prefix, turns=2)
    inp = TrajectoryInput(task=frozenlake_task(reward_placement=placement), seed=1, queue_prefix=queue_prefix)
    async with standin_workers(bare_env.client, s, workflows=[TrajectoryWorkflow], reward_pools=("serverless", pool)):
        result = await bare_env.client.execute_workflow(
            TrajectoryWorkflow.run,
            inp,
            id=f"t-{uuid.uuid4().hex[:8]}",
            task_queue=queue_name(Pool.CONTROL, queue_prefix),
        )
    assert result.status == "completed" and result.success
    assert [(c.name, c.queue) for c in s.called("reward")] == [("reward", queue_name(pool, queue_prefix))]


@pytest.mark.orchestration
async def test_single_turn_group_reward_goes_to_the_generation_pool_when_colocated(
    bare_env: WorkflowEnvironment, queue_prefix: str
) -> None:
    s = StandIns(prefix=queue_prefix)
    task = TaskSpec(
        name="arith",
        env="arithmetic",
        reward="reward_model",
        reward_args={"weight": 0.0},
        reward_placement="colocated",
        generate_pool="h20",
        max_turns=1,
        group_size=4,
    )
    inp = GroupRolloutInput(task=task, groups=[GroupSeed(group_id="g0", seed=3)], queue_prefix=queue_prefix)
    async with standin_workers(bare_env.client, s, workflows=[GroupRolloutWorkflow], reward_pools=["h20"]):
        results = await bare_env.client.execute_workflow(
            GroupRolloutWorkflow.run,
            inp,
            id=f"g-{uuid.uuid4().hex[:8]}",
            task_queue=queue_name(Pool.CONTROL, queue_prefix),
        )
    assert len(results) == 4 and all(r.status == "completed" for r in results)
    h20 = queue_name(Pool.H20, queue_prefix)
    assert [(c.queue, c.inp.reward_args) for c in s.called("reward_batch")] == [(h20, {"weight": 0.0})]
    assert all(c.queue != queue_name(Pool.SERVERLESS, queue_prefix) for c in s.calls)  # no serverless worker needed


def test_default_stack_job_autoscales_serverless_between_1_and_4(tmp_path: Path) -> None:
    job = JobSpec(tasks=[frozenlake_task()])
    cfg = job.elastic(Pool.SERVERLESS)
    assert (cfg.min_workers, cfg.max_workers) == (1, 4) and cfg.per_worker == cfg.max_concurrent_activities
    with pytest.raises(ValueError, match="not elastic"):
        job.elastic(Pool.CPU)


def test_reward_model_example_checks() -> None:
    from rollart.spec.config import load_job

    job = load_job(REPO / "examples" / "reward_model.yaml")
    check_job_components(job)
    assert job.tasks[0].reward_queue == "serverless" and job.elastic(Pool.SERVERLESS).min_workers == 0
