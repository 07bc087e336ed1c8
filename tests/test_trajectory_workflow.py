"""TrajectoryWorkflow's orchestration logic, against a real dev server with stand-in activities.

Stand-ins are registered under the real activity names on the real queue
names, so routing is exercised exactly; only the work is faked.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from pydantic import ValidationError
from rollart.activities.errors import env_broken, unknown_component
from rollart.contracts.activities import (
    CloseInput,
    Completion,
    EnvHandle,
    GenerateInput,
    GenerateResult,
    ResetInput,
    RewardInput,
    RewardResult,
    StepInput,
    StepResult,
)
from rollart.infra.config import SamplingParams
from rollart.workflows import TrajectoryWorkflow
from rollart.contracts.rollouts import TrajectoryInput, TrajectoryResult
from temporalio import activity
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests.conftest import frozenlake_task

SESSION_QUEUE = "cpu@stand-in"


@dataclass
class StandIns:
    """Scripted env/engine/reward: done after `episode_len` steps; optional failures."""

    episode_len: int = 3
    fail_step_at: int | None = None
    unknown_env: bool = False
    versions: list[int] = field(default_factory=lambda: [0])
    calls: list[tuple[str, str]] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    _steps: int = 0

    @activity.defn(name="reset")
    async def reset(self, inp: ResetInput) -> EnvHandle:
        self.calls.append(("reset", activity.info().task_queue))
        if self.unknown_env:
            raise unknown_component(f"unknown env {inp.env!r}")
        return EnvHandle(session_id="s1", queue=SESSION_QUEUE, worker_id="stand-in", observation="obs0")

    @activity.defn(name="generate")
    async def generate(self, inp: GenerateInput) -> GenerateResult:
        self.calls.append(("generate", activity.info().task_queue))
        v = self.versions[min(len([c for c in self.calls if c[0] == "generate"]) - 1, len(self.versions) - 1)]
        return GenerateResult(
            completions=[Completion(text="R", num_tokens=1, finish_reason="length")],
            prompt_tokens=4, policy_version=v, policy_version_end=v, data_key=inp.data_key,
        )  # fmt: skip

    @activity.defn(name="step")
    async def step(self, inp: StepInput) -> StepResult:
        self.calls.append(("step", activity.info().task_queue))
        self._steps += 1
        if self.fail_step_at == self._steps:
            raise env_broken("env 'x' step raised RuntimeError: boom")
        done = self._steps >= self.episode_len
        return StepResult(observation=f"obs{self._steps}", reward=float(done), done=done,
                          info={"success": done, "valid": True})  # fmt: skip

    @activity.defn(name="close")
    async def close(self, inp: CloseInput) -> None:
        self.calls.append(("close", activity.info().task_queue))
        self.closed.append(inp.session_id)

    @activity.defn(name="reward")
    async def reward(self, inp: RewardInput) -> RewardResult:
        self.calls.append(("reward", activity.info().task_queue))
        ok = any(t.info.get("success") for t in inp.transcript.turns)
        return RewardResult(value=float(ok), success=ok)


@contextlib.asynccontextmanager
async def workers(client: Client, s: StandIns) -> AsyncIterator[None]:
    async with contextlib.AsyncExitStack() as stack:
        for queue, acts in [
            ("control", None),
            ("cpu", [s.reset]),
            (SESSION_QUEUE, [s.step, s.close]),
            ("h800", [s.generate]),
            ("serverless", [s.reward]),
        ]:
            kwargs = {"workflows": [TrajectoryWorkflow]} if acts is None else {"activities": acts}
            await stack.enter_async_context(Worker(client, task_queue=queue, **kwargs))
        yield


async def run(client: Client, inp: TrajectoryInput) -> TrajectoryResult:
    return await client.execute_workflow(
        TrajectoryWorkflow.run, inp, id=f"t-{uuid.uuid4().hex[:8]}", task_queue="control"
    )


async def test_routes_each_activity_to_its_pool(bare_env: WorkflowEnvironment) -> None:
    s = StandIns(episode_len=3)
    async with workers(bare_env.client, s):
        result = await run(bare_env.client, TrajectoryInput(task=frozenlake_task(max_turns=8), seed=1))
    assert result.status == "completed" and result.success and result.reward == 1.0
    assert result.turns == 3
    expected = [("reset", "cpu")] + [("generate", "h800"), ("step", SESSION_QUEUE)] * 3
    assert s.calls == expected + [("reward", "serverless"), ("close", SESSION_QUEUE)]
    assert len(result.turn_keys) == 3 and all(k.endswith(f"turn-{i:03d}") for i, k in enumerate(result.turn_keys))


async def test_max_turns_ends_the_episode(bare_env: WorkflowEnvironment) -> None:
    s = StandIns(episode_len=100, versions=[0, 1, 2])
    async with workers(bare_env.client, s):
        result = await run(bare_env.client, TrajectoryInput(task=frozenlake_task(max_turns=4), seed=1))
    assert result.status == "completed" and result.turns == 4 and result.success is False
    assert (result.policy_version_min, result.policy_version_max) == (0, 2)


async def test_env_that_raises_fails_the_trajectory_not_the_workflow(bare_env: WorkflowEnvironment) -> None:
    s = StandIns(episode_len=5, fail_step_at=2)
    async with workers(bare_env.client, s):
        result = await run(bare_env.client, TrajectoryInput(task=frozenlake_task(), seed=1))
    assert result.status == "failed"
    assert result.reward is None and result.success is None  # never scored 0
    assert "step failed: EnvBroken" in (result.error or "") and "boom" in (result.error or "")
    assert s.closed == ["s1"]  # the session is released even so
    assert ("reward", "serverless") not in s.calls
    assert [c for c in s.calls if c[0] == "step"] == [("step", SESSION_QUEUE)] * 2  # not retried


async def test_unknown_env_fails_the_workflow_at_once(bare_env: WorkflowEnvironment) -> None:
    s = StandIns(unknown_env=True)
    async with workers(bare_env.client, s):
        with pytest.raises(WorkflowFailureError) as err:
            await run(bare_env.client, TrajectoryInput(task=frozenlake_task(env="nope"), seed=1))
    cause = err.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "UnknownComponent" and cause.non_retryable
    assert "nope" in cause.message
    assert s.calls == [("reset", "cpu")]


async def test_multi_sample_tasks_are_rejected(bare_env: WorkflowEnvironment) -> None:
    with pytest.raises(ValidationError, match="sampling.n is 4, but a multi-turn task"):  # at load, naming the field
        frozenlake_task(sampling=SamplingParams(n=4))
    task = frozenlake_task().model_dump(mode="json")
    task["sampling"]["n"] = 4
    s = StandIns()
    async with workers(bare_env.client, s):  # sent as raw JSON (`temporal workflow start`): the workflow fails at once
        with pytest.raises(WorkflowFailureError) as err:
            await bare_env.client.execute_workflow("TrajectoryWorkflow", {"task": task, "seed": 1},
                                                   id=f"t-{uuid.uuid4().hex[:8]}", task_queue="control")  # fmt: skip
    assert "sampling.n is 4" in str(err.value.cause)
    assert s.calls == []
