"""Sticky-session failover against a real dev server, with stand-in activities (no engine, no env process).

An env worker that is gone shows up two ways: its private queue has no poller
(schedule-to-start timeout) or it answers SessionLost. Either way the episode
(or the lockstep group) must call `restore` on the shared cpu queue with its
seed, recorded actions and last observations, move to the new queue and go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from rollart.contracts.activities import (
    CloseInput,
    Completion,
    EnvHandle,
    GenerateBatchInput,
    GenerateInput,
    GenerateResult,
    GroupHandle,
    GroupResetInput,
    GroupStepInput,
    ResetInput,
    RestoreInput,
    RewardBatchInput,
    RewardInput,
    RewardResult,
    StepInput,
    StepResult,
    TrainStepInput,
    TrainStepResult,
)
from rollart.infra.config import JobSpec, TrainingConfig
from rollart.infra.search_attributes import ensure_registered
from rollart.workflows import ALL_WORKFLOWS
from rollart.contracts.training import TrainingInput, TrainingResult, TrainingStatus
from rollart.contracts.rollouts import GroupRolloutInput, GroupSeed, TrajectoryInput, TrajectoryResult
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests.support.tasks import frozenlake_task

LIVE = "cpu@live-stand-in"
DEAD = "cpu@dead-stand-in"  # nobody polls it: the worker behind it was killed


@dataclass
class Envs:
    """A counter env: observation = number of actions applied; done after `turns` actions.

    `lose_after`: a session made by reset answers SessionLost once it has taken that many steps
    (its worker restarted); `dead_resets`: resets hand out a session on the dead queue.
    """

    turns: int = 3
    lose_after: int | None = None
    dead_resets: bool = False
    restores: list[RestoreInput] = field(default_factory=list)
    trained: list[str] = field(default_factory=list)
    version: int = 0  # the policy the stand-in engine serves: the last one trained
    _steps: dict[str, list[int]] = field(default_factory=dict)  # session → steps taken per member
    _restored: set[str] = field(default_factory=set)

    def _session(self, owner: str, members: int, queue: str, taken: list[int] | None = None) -> str:
        sid = f"{owner}/{uuid.uuid4().hex[:6]}"
        self._steps[sid] = taken or [0] * members
        return sid

    @activity.defn(name="reset")
    async def reset(self, inp: ResetInput) -> EnvHandle:
        sid = self._session(inp.trajectory_id, 1, DEAD if self.dead_resets else LIVE)
        return EnvHandle(session_id=sid, queue=DEAD if self.dead_resets else LIVE, worker_id="w1", observation="0")

    @activity.defn(name="reset_group")
    async def reset_group(self, inp: GroupResetInput) -> GroupHandle:
        sid = self._session(inp.group_id, inp.size, DEAD if self.dead_resets else LIVE)
        return GroupHandle(session_id=sid, queue=DEAD if self.dead_resets else LIVE, worker_id="w1",
                           observations=["0"] * inp.size)  # fmt: skip

    @activity.defn(name="restore")
    async def restore(self, inp: RestoreInput) -> GroupHandle:
        self.restores.append(inp)
        assert [str(len(a)) for a in inp.actions] == inp.observations  # replay ends where each member was
        sid = self._session(inp.owner_id, len(inp.actions), LIVE, [len(a) for a in inp.actions])
        self._restored.add(sid)
        return GroupHandle(session_id=sid, queue=LIVE, worker_id="w2", observations=inp.observations)

    def _apply(self, sid: str, member: int) -> StepResult:
        taken = self._steps[sid]
        if sid not in self._restored and self.lose_after is not None and taken[member] >= self.lose_after:
            raise ApplicationError(f"no session {sid!r}", type="SessionLost", non_retryable=True)
        taken[member] += 1
        return StepResult(observation=str(taken[member]), reward=0.0, done=taken[member] >= self.turns)

    @activity.defn(name="step")
    async def step(self, inp: StepInput) -> StepResult:
        return self._apply(inp.session_id, 0)

    @activity.defn(name="step_group")
    async def step_group(self, inp: GroupStepInput) -> list[StepResult | None]:
        if self.lose_after is not None and inp.session_id not in self._restored:
            if max(self._steps[inp.session_id]) >= self.lose_after:
                raise ApplicationError("no session", type="SessionLost", non_retryable=True)
        return [None if a is None else self._apply(inp.session_id, i) for i, a in enumerate(inp.actions)]

    @activity.defn(name="close")
    async def close(self, inp: CloseInput) -> None:
        self._steps.pop(inp.session_id, None)

    @activity.defn(name="generate")
    async def generate(self, inp: GenerateInput) -> GenerateResult:
        return _gen(inp.data_key, self.version)

    @activity.defn(name="generate_batch")
    async def generate_batch(self, inp: GenerateBatchInput) -> list[GenerateResult]:
        return [_gen(k, self.version) for k in inp.data_keys]

    @activity.defn(name="reward")
    async def reward(self, inp: RewardInput) -> RewardResult:
        return RewardResult(value=float(len(inp.transcript.turns)), success=True)

    @activity.defn(name="reward_batch")
    async def reward_batch(self, inp: RewardBatchInput) -> list[RewardResult]:
        return [RewardResult(value=float(len(t.turns)), success=True) for t in inp.transcripts]

    @activity.defn(name="train_step")
    async def train_step(self, inp: TrainStepInput) -> TrainStepResult:
        self.trained += [s.trajectory_id for s in inp.samples]
        self.version = inp.step + 1
        return TrainStepResult(step=inp.step, version=inp.step + 1, weights_key="k")


def _gen(data_key: str, version: int = 0) -> GenerateResult:
    return GenerateResult(completions=[Completion(text="R", num_tokens=1, finish_reason="length")], prompt_tokens=1,
                          policy_version=version, policy_version_end=version, data_key=data_key)  # fmt: skip


@contextlib.asynccontextmanager
async def workers(client: Client, e: Envs) -> AsyncIterator[None]:
    async with contextlib.AsyncExitStack() as stack:
        for queue, kwargs in [
            ("control", {"workflows": ALL_WORKFLOWS}),
            ("cpu", {"activities": [e.reset, e.reset_group, e.restore]}),
            (LIVE, {"activities": [e.step, e.step_group, e.close]}),
            ("h800", {"activities": [e.generate, e.generate_batch]}),
            ("serverless", {"activities": [e.reward, e.reward_batch]}),
            ("trainer", {"activities": [e.train_step]}),
        ]:
            await stack.enter_async_context(Worker(client, task_queue=queue, **kwargs))
        yield


async def run_trajectory(env: WorkflowEnvironment, e: Envs) -> TrajectoryResult:
    inp = TrajectoryInput(task=frozenlake_task(max_turns=5), seed=7)
    async with workers(env.client, e):
        return await env.client.execute_workflow("TrajectoryWorkflow", inp, id=f"fo-{uuid.uuid4().hex[:8]}",
                                                 task_queue="control", result_type=TrajectoryResult)  # fmt: skip


async def test_a_session_lost_mid_episode_is_restored_and_the_episode_goes_on(bare_env: WorkflowEnvironment) -> None:
    e = Envs(turns=3, lose_after=2)
    r = await run_trajectory(bare_env, e)
    assert r.status == "completed" and r.turns == 3 and r.reward == 3.0 and r.restores == 1
    [restore] = e.restores
    assert restore.seed == 7 and restore.actions == [["R", "R"]] and restore.observations == ["2"]
    assert r.env_worker == "w2"


async def test_a_dead_workers_queue_is_detected_by_schedule_to_start(bare_env: WorkflowEnvironment) -> None:
    e = Envs(turns=2, dead_resets=True)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    r = await run_trajectory(bare_env, e)
    assert r.status == "completed" and r.turns == 2 and r.restores == 1
    assert e.restores[0].actions == [[]] and e.restores[0].observations == ["0"]
    assert loop.time() - t0 < 30  # detected in STICKY_START (10 s), not the step's minutes


async def test_a_lockstep_group_restores_all_its_members(bare_env: WorkflowEnvironment) -> None:
    e = Envs(turns=3, lose_after=1)
    task = frozenlake_task(max_turns=5, group_size=3, rollout_unit="group")
    inp = GroupRolloutInput(task=task, groups=[GroupSeed(group_id="g", seed=4)])
    async with workers(bare_env.client, e):
        results = await bare_env.client.execute_workflow(
            "GroupRolloutWorkflow", inp, id=f"fo-{uuid.uuid4().hex[:8]}", task_queue="control",
            result_type=list[TrajectoryResult],
        )  # fmt: skip
    assert [r.status for r in results] == ["completed"] * 3 and all(r.turns == 3 and r.restores == 1 for r in results)
    [restore] = e.restores
    assert restore.owner_id == "g" and restore.actions == [["R"]] * 3 and restore.observations == ["1"] * 3


async def test_training_through_env_worker_loss_trains_every_trajectory_once(bare_env: WorkflowEnvironment) -> None:
    await ensure_registered(bare_env.client)
    e = Envs(turns=2, lose_after=1)  # every session is lost after its first step
    spec = JobSpec(name="fo", tasks=[frozenlake_task(group_size=2, max_turns=3)],
                   training=TrainingConfig(steps=3, batch_size=4, async_bound=1))  # fmt: skip
    job_id = f"fo-{uuid.uuid4().hex[:8]}"
    async with workers(bare_env.client, e):
        handle = await bare_env.client.start_workflow(
            "TrainingWorkflow", TrainingInput(job=spec, job_id=job_id, run_dir="/tmp/unused"), id=job_id,
            task_queue="control", result_type=TrainingResult,
        )  # fmt: skip
        result = await asyncio.wait_for(handle.result(), 300)
        status = await handle.query("status", result_type=TrainingStatus)
    assert result.version == 3 and result.failed == 0 and status.ledger_balanced
    assert len(e.trained) == len(set(e.trained)) == result.trained == 12
    assert status.restores >= result.trained  # every trained trajectory moved once
