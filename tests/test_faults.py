"""The fault model, the pre-reset pool and session restore, in isolation (no server)."""

from __future__ import annotations

import asyncio
import random
import statistics

import pytest
from pydantic import ValidationError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from rollart.activities.env import EnvActivities
from rollart.activities.env_pool import ResetPool
from rollart.activities.envs.faults import FaultInjector, FaultyEnv
from rollart.activities.envs.frozenlake import FrozenLake
from rollart.contracts.activities import (
    EnvOptions,
    GroupResetInput,
    GroupStepInput,
    ResetInput,
    RestoreInput,
    StepInput,
)
from rollart.spec.config import FaultModel, LatencyModel
from tests.support.tasks import frozenlake_task

ENV = ActivityEnvironment()
LAKE = {"maps": "standard"}


def test_lognormal_latency_has_the_median_and_p99_it_was_given() -> None:
    model = LatencyModel(median_s=0.1, p99_s=2.0)
    rng = random.Random(0)
    draws = sorted(model.draw(rng) for _ in range(200_000))
    assert statistics.median(draws) == pytest.approx(0.1, rel=0.02)
    assert draws[int(0.99 * len(draws))] == pytest.approx(2.0, rel=0.05)
    assert LatencyModel().draw(rng) == 0.0


def test_fault_model_is_validated() -> None:
    with pytest.raises(ValidationError, match="p99_s"):
        LatencyModel(median_s=1.0, p99_s=0.5)
    with pytest.raises(ValidationError):
        FaultModel(reset_failure_p=1.5)
    task = frozenlake_task(
        faults={"reset_latency": {"median_s": 0.01, "p99_s": 0.2}, "reset_failure_p": 0.05}, reset_pool_size=2
    )
    opts = EnvOptions.of(task)
    assert opts is not None and opts.faults == task.faults and opts.reset_pool_size == 2
    assert EnvOptions.of(frozenlake_task()) is None  # a task without them sends none (old inputs decode alike)


def test_faulty_env_fails_resets_at_its_rate_and_steps_before_touching_the_env() -> None:
    injector = FaultInjector(FaultModel(reset_failure_p=0.05, step_failure_p=0.5, seed=1))
    env = FaultyEnv(FrozenLake(**LAKE), injector)
    failures = 0
    for seed in range(4000):
        try:
            env.reset(seed)
        except RuntimeError:
            failures += 1
    assert 0.04 < failures / 4000 < 0.06
    while True:
        try:
            env.reset(0)
            break
        except RuntimeError:
            pass
    steps = 0
    for _ in range(50):  # a failed step leaves the episode where it was: the next success continues it
        try:
            outcome = env.step("D")
            steps += 1
        except RuntimeError:
            continue
        if outcome.done:
            break
    assert steps >= 1


async def test_reset_pool_hedges_and_keeps_spares_for_the_same_seed() -> None:
    pool = ResetPool()
    calls = 0

    async def reset_one() -> tuple[object, str]:
        nonlocal calls
        calls += 1
        me = calls
        await asyncio.sleep(0.2 if me == 1 else 0.01)  # the first reset is the slow tail
        return object(), f"obs{me}"

    [(_, obs)] = await pool.take("k", 1, 3, reset_one)
    assert calls == 3 and obs in ("obs2", "obs3")  # answered by a fast hedge, not the slow one
    await asyncio.sleep(0.3)
    assert pool.spares("k") == 2  # the other two are kept (≤ size)
    [(_, _again)] = await pool.take("k", 1, 3, reset_one)
    assert calls == 3 and pool.hits == 1  # served from the spares, no new reset


async def test_reset_pool_raises_when_every_hedge_fails() -> None:
    async def broken() -> tuple[object, str]:
        raise ApplicationError("nope", type="EnvResetError")

    with pytest.raises(ApplicationError, match="nope"):
        await ResetPool().take("k", 2, 2, broken)


async def test_resets_under_injected_failures_succeed_with_the_pool() -> None:
    acts = EnvActivities("w", queue="cpu@w")
    opts = EnvOptions(faults=FaultModel(reset_failure_p=0.3, seed=3), reset_pool_size=3)
    ok = failed = 0
    for seed in range(200):
        try:
            await ENV.run(
                acts.reset,
                ResetInput(env="frozenlake", env_args=LAKE, seed=seed, trajectory_id=f"t{seed}", options=opts),
            )
            ok += 1
        except ApplicationError:
            failed += 1
    # one attempt fails only if all three hedges fail: 0.3^3 = 2.7 %
    assert ok + failed == 200 and failed <= 15
    acts.shutdown()


async def test_reset_timeout_is_the_tasks_when_set() -> None:
    acts = EnvActivities("w", queue="cpu@w")
    slow = EnvOptions(faults=FaultModel(reset_latency=LatencyModel(median_s=0.5, p99_s=0.5)), reset_timeout_s=0.05)
    with pytest.raises(ApplicationError) as err:
        await ENV.run(acts.reset, ResetInput(env="frozenlake", env_args=LAKE, seed=0, trajectory_id="t", options=slow))
    assert err.value.type == "EnvResetTimeout" and not err.value.non_retryable
    acts.shutdown()


async def test_restore_replays_actions_and_continues_where_the_episode_was() -> None:
    first, second = EnvActivities("w1", queue="cpu@w1"), EnvActivities("w2", queue="cpu@w2")
    h = await ENV.run(first.reset, ResetInput(env="frozenlake", env_args=LAKE, seed=0, trajectory_id="t"))
    actions, observation = ["R", "R", "zz"], h.observation
    for a in actions:
        observation = (await ENV.run(first.step, StepInput(session_id=h.session_id, action=a))).observation
    # w1 dies: w2 rebuilds the session from the seed and the recorded actions
    moved = await ENV.run(
        second.restore,
        RestoreInput(
            env="frozenlake", env_args=LAKE, seed=0, owner_id="t", actions=[actions], observations=[observation]
        ),
    )
    assert moved.queue == "cpu@w2" and moved.observations == [observation]
    on_w1 = await ENV.run(first.step, StepInput(session_id=h.session_id, action="D"))
    on_w2 = await ENV.run(second.step, StepInput(session_id=moved.session_id, action="D"))
    assert on_w1 == on_w2  # the restored env is in the same state


async def test_restore_of_a_diverging_env_fails_without_retry() -> None:
    acts = EnvActivities("w", queue="cpu@w")
    with pytest.raises(ApplicationError) as err:
        await ENV.run(
            acts.restore,
            RestoreInput(
                env="frozenlake",
                env_args=LAKE,
                seed=0,
                owner_id="t",
                actions=[["R"]],
                observations=["not what the env shows"],
            ),
        )
    assert err.value.type == "ReplayMismatch" and err.value.non_retryable
    assert acts.open_sessions == 0


async def test_restore_rebuilds_a_whole_group() -> None:
    acts = EnvActivities("w", queue="cpu@w")
    g = await ENV.run(acts.reset_group, GroupResetInput(env="frozenlake", env_args=LAKE, seed=0, size=2, group_id="g"))
    steps = await ENV.run(acts.step_group, GroupStepInput(session_id=g.session_id, actions=["R", "D"]))
    moved = await ENV.run(
        acts.restore,
        RestoreInput(
            env="frozenlake",
            env_args=LAKE,
            seed=0,
            owner_id="g",
            actions=[["R"], ["D"]],
            observations=[s.observation for s in steps],
        ),
    )
    assert moved.observations == [s.observation for s in steps] and acts.open_sessions == 2
