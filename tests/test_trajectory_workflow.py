"""TrajectoryWorkflow's orchestration logic, against a real dev server with stand-in activities.

Stand-ins are registered under the real activity names on the real queue
names, so routing is exercised exactly; only the work is faked.
"""

from __future__ import annotations

import contextlib
import uuid

import pytest
from pydantic import ValidationError
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from rollart.contracts.rollouts import TrajectoryInput, TrajectoryResult
from rollart.spec.config import SamplingParams
from rollart.spec.pools import Pool, queue_name
from rollart.workflows import TrajectoryWorkflow
from tests.support.standins import StandIns, standin_workers
from tests.support.tasks import frozenlake_task

pytestmark = pytest.mark.orchestration


def workers(client: Client, s: StandIns) -> contextlib.AbstractAsyncContextManager[None]:
    """The stand-ins' workers, with only TrajectoryWorkflow on the control queue."""
    return standin_workers(client, s, workflows=[TrajectoryWorkflow])


def queues(s: StandIns) -> list[tuple[str, str]]:
    """(activity, queue) of every call, in order."""
    return [(c.name, c.queue) for c in s.calls]


async def run(client: Client, inp: TrajectoryInput) -> TrajectoryResult:
    """Run one TrajectoryWorkflow to its end, on the control queue of its prefix."""
    control = queue_name(Pool.CONTROL, inp.queue_prefix)
    return await client.execute_workflow(
        TrajectoryWorkflow.run, inp, id=f"t-{uuid.uuid4().hex[:8]}", task_queue=control
    )


async def test_routes_each_activity_to_its_pool(bare_env: WorkflowEnvironment, queue_prefix: str) -> None:
    s = StandIns(prefix=queue_prefix, turns=3)
    async with workers(bare_env.client, s):
        result = await run(
            bare_env.client, TrajectoryInput(task=frozenlake_task(max_turns=8), seed=1, queue_prefix=queue_prefix)
        )
    assert result.status == "completed" and result.success and result.reward == 1.0
    assert result.turns == 3
    cpu, h800, serverless = (queue_name(p, queue_prefix) for p in (Pool.CPU, Pool.H800, Pool.SERVERLESS))
    expected = [("reset", cpu)] + [("generate", h800), ("step", s.session_queue)] * 3
    assert queues(s)[:-2] == expected
    # reward and close run together (patch close-while-scoring): either may reach its worker first
    assert sorted(queues(s)[-2:]) == [("close", s.session_queue), ("reward", serverless)]
    assert len(result.turn_keys) == 3 and all(k.endswith(f"turn-{i:03d}") for i, k in enumerate(result.turn_keys))


async def test_max_turns_ends_the_episode(bare_env: WorkflowEnvironment, queue_prefix: str) -> None:
    s = StandIns(prefix=queue_prefix, turns=100, versions=[0, 1, 2])
    async with workers(bare_env.client, s):
        result = await run(
            bare_env.client, TrajectoryInput(task=frozenlake_task(max_turns=4), seed=1, queue_prefix=queue_prefix)
        )
    assert result.status == "completed" and result.turns == 4 and result.success is False
    assert (result.policy_version_min, result.policy_version_max) == (0, 2)


async def test_env_that_raises_fails_the_trajectory_not_the_workflow(
    bare_env: WorkflowEnvironment, queue_prefix: str
) -> None:
    s = StandIns(prefix=queue_prefix, turns=5, fail_step_at=2)
    async with workers(bare_env.client, s):
        result = await run(bare_env.client, TrajectoryInput(task=frozenlake_task(), seed=1, queue_prefix=queue_prefix))
    assert result.status == "failed"
    assert result.reward is None and result.success is None  # never scored 0
    assert "step failed: EnvBroken" in (result.error or "") and "boom" in (result.error or "")
    assert [c.what for c in s.called("close")] == [s.called("step")[0].what]  # the session is released even so
    assert not s.called("reward")
    assert [c for c in queues(s) if c[0] == "step"] == [("step", s.session_queue)] * 2  # not retried


async def test_unknown_env_fails_the_workflow_at_once(bare_env: WorkflowEnvironment, queue_prefix: str) -> None:
    s = StandIns(prefix=queue_prefix, unknown_env=True)
    async with workers(bare_env.client, s):
        with pytest.raises(WorkflowFailureError) as err:
            await run(
                bare_env.client, TrajectoryInput(task=frozenlake_task(env="nope"), seed=1, queue_prefix=queue_prefix)
            )
    cause = err.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "UnknownComponent" and cause.non_retryable
    assert "nope" in cause.message
    assert queues(s) == [("reset", queue_name(Pool.CPU, queue_prefix))]


async def test_multi_sample_tasks_are_rejected(bare_env: WorkflowEnvironment, queue_prefix: str) -> None:
    with pytest.raises(ValidationError, match=r"sampling.n is 4, but a multi-turn task"):  # at load, naming the field
        frozenlake_task(sampling=SamplingParams(n=4))
    task = frozenlake_task().model_dump(mode="json")
    task["sampling"]["n"] = 4
    s = StandIns(prefix=queue_prefix)
    async with workers(bare_env.client, s):  # sent as raw JSON (`temporal workflow start`): the workflow fails at once
        with pytest.raises(WorkflowFailureError) as err:
            await bare_env.client.execute_workflow(
                "TrajectoryWorkflow",
                {"task": task, "seed": 1, "queue_prefix": queue_prefix},
                id=f"t-{uuid.uuid4().hex[:8]}",
                task_queue=queue_name(Pool.CONTROL, queue_prefix),
            )
    assert "sampling.n is 4" in str(err.value.cause)
    assert s.calls == []
