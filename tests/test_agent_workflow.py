"""Agent trajectories in the training loop, on stand-in activities: each stand-in program's chat requests are turns
of its trajectory (continued token by token), a crashed program's trajectory is failed and masked, the ledger
balances, and a turn past max_turns is refused, never generated."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field

import pytest
from temporalio import activity
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from rollart.contracts.agent import CHAT_UPDATE, ChatInput, ChatReply, RunAgentInput, RunAgentResult, TurnRefused
from rollart.contracts.conversation import history_digest
from rollart.contracts.generation import GenerateInput
from rollart.contracts.rollouts import TrajectoryInput, TrajectoryResult
from rollart.contracts.training import TrainingInput, TrainingResult, TrainingStatus
from rollart.infra.temporal.search_attributes import ensure_registered
from rollart.spec.chat import ChatMessage
from rollart.spec.config import JobSpec, TaskSpec, TrainingConfig, resolve_task
from rollart.spec.pools import Pool, queue_name
from tests.support.standins import StandIns, standin_workers
from tests.support.tasks import with_queue_prefix

pytestmark = pytest.mark.orchestration


def agent_task(**overrides: object) -> TaskSpec:
    base = {"name": "agent", "env": "agent", "env_args": {"entry": "m:run"}, "reward": "success", "max_turns": 3}
    return resolve_task(TaskSpec.model_validate({**base, **overrides}))


@pytest.mark.parametrize("unit", [{}, {"rollout_unit": "group", "group_play": "free"}], ids=["trajectory", "free"])
async def test_agent_trajectories_train_and_a_crashed_program_is_masked(
    bare_env: WorkflowEnvironment, queue_prefix: str, unit: dict[str, str]
) -> None:
    """As trajectories, or as free members of their group's one workflow (each program's requests name its
    member): the same turns, masks and ledger."""
    await ensure_registered(bare_env.client)
    s = StandIns(prefix=queue_prefix, agent_turns=2, fail_seeds={1}, train_delay_s=0.05)
    spec = JobSpec(
        name="agent",
        tasks=[agent_task(group_size=2, **unit)],
        training=TrainingConfig(steps=3, batch_size=4, async_bound=1),
    )
    spec = with_queue_prefix(spec, queue_prefix)
    job_id = f"ag-{uuid.uuid4().hex[:8]}"
    async with standin_workers(bare_env.client, s):
        handle = await bare_env.client.start_workflow(
            "TrainingWorkflow",
            TrainingInput(job=spec, job_id=job_id, run_dir="/tmp/unused"),
            id=job_id,
            task_queue=queue_name(Pool.CONTROL, queue_prefix),
            result_type=TrainingResult,
        )
        result = await asyncio.wait_for(handle.result(), 300)
        status = await handle.query("status", result_type=TrainingStatus)
    assert result.version == 3 and status.ledger_balanced and result.failed >= 2  # seed 1's group: both members
    assert len(s.trained_ids) == len(set(s.trained_ids)) == result.trained
    trained = [sample for inp in s.inputs("train_step") for sample in inp.samples]
    assert all(len(sample.turn_keys) == 2 and sample.reward == 2.0 for sample in trained)
    # each program's second request continued its first: only the new user message, after the first turn's record
    gens: list[GenerateInput] = s.inputs("generate")
    seconds = [g for g in gens if g.data_key.endswith("turn-001")]
    assert seconds and all(g.prefix_key == g.data_key.replace("turn-001", "turn-000") for g in seconds)
    assert all([m.content for m in g.messages or []] == ["after turn 0"] for g in seconds)
    assert all(g.prefix_key is None and g.messages and len(g.messages) == 1 for g in gens if g.data_key.endswith("0"))
    programs: list[RunAgentInput] = s.inputs("run_agent")
    grouped = bool(unit)  # a member's program names its trajectory; a trajectory's own program needs not
    assert all(bool(p.trajectory) == grouped for p in programs)
    if grouped:
        assert {sample.trajectory_id for sample in trained} <= {p.trajectory for p in programs}


async def test_a_request_past_max_turns_is_refused_and_never_generated(
    bare_env: WorkflowEnvironment, queue_prefix: str
) -> None:
    s = StandIns(prefix=queue_prefix, agent_turns=3)
    task = agent_task(max_turns=2)
    inp = TrajectoryInput(task=task, seed=5, job_id="agent-max", queue_prefix=queue_prefix)
    async with standin_workers(bare_env.client, s):
        result = await bare_env.client.execute_workflow(
            "TrajectoryWorkflow",
            inp,
            id=f"ag-{uuid.uuid4().hex[:8]}",
            task_queue=queue_name(Pool.CONTROL, queue_prefix),
            result_type=TrajectoryResult,
        )
    # the stand-in program does not catch the refusal of its third request: it fails, as a program that crashed
    assert result.status == "failed" and "WorkflowUpdateFailedError" in (result.error or ""), result
    assert result.turns == 2 and len(s.inputs("generate")) == 2 and result.reward is None


async def test_bad_agent_args_fail_the_workflow_saying_why(bare_env: WorkflowEnvironment, queue_prefix: str) -> None:
    s = StandIns(prefix=queue_prefix)
    inp = TrajectoryInput(task=agent_task(env_args={"entry": "no-colon"}), seed=5, queue_prefix=queue_prefix)
    cause = await failed_workflow(bare_env, s, inp)
    assert "must be 'module:" in str(cause) and not s.called("run_agent")


async def failed_workflow(env: WorkflowEnvironment, s: StandIns, inp: TrajectoryInput) -> BaseException | None:
    """Run the trajectory, which must fail: the cause its workflow failed with."""
    async with standin_workers(env.client, s):
        with pytest.raises(WorkflowFailureError) as failed:
            await env.client.execute_workflow(
                "TrajectoryWorkflow",
                inp,
                id=f"ag-{uuid.uuid4().hex[:8]}",
                task_queue=queue_name(Pool.CONTROL, inp.queue_prefix),
                result_type=TrajectoryResult,
            )
    return failed.value.cause


@dataclass
class ReturnsNoReward(StandIns):
    """A program that plays its turns and returns no reward."""

    @activity.defn(name="run_agent")
    async def run_agent(self, inp: RunAgentInput) -> RunAgentResult:
        await super().run_agent(inp)
        return RunAgentResult()


async def test_a_program_returning_no_reward_for_a_task_without_one_fails_the_workflow_saying_so(
    bare_env: WorkflowEnvironment, queue_prefix: str
) -> None:
    s = ReturnsNoReward(prefix=queue_prefix, agent_turns=1)
    inp = TrajectoryInput(task=agent_task(reward=None), seed=5, queue_prefix=queue_prefix)
    cause = await failed_workflow(bare_env, s, inp)
    assert isinstance(cause, ApplicationError) and cause.type == "InvalidInput" and cause.non_retryable
    assert "return the reward from run()" in cause.message and not s.called("reward")


@dataclass
class DigestProbe(StandIns):
    """A program as the endpoint relays it, sending its second request as new messages after a held history: once
    with a digest the workflow does not hold (refused), then with the right one."""

    refusals: list[str] = field(default_factory=list)

    @activity.defn(name="run_agent")
    async def run_agent(self, inp: RunAgentInput) -> RunAgentResult:
        handle = activity.client().get_workflow_handle(activity.info().workflow_id)
        first = ChatMessage(role="user", content="hi")
        reply = await handle.execute_update(CHAT_UPDATE, ChatInput(messages=[first]), result_type=ChatReply)
        held = [first, ChatMessage(role="assistant", content=reply.content, tool_calls=reply.tool_calls)]
        more = [ChatMessage(role="user", content="more")]
        try:
            stale = ChatInput(messages=more, history_len=2, history_digest="0" * 64)
            await handle.execute_update(CHAT_UPDATE, stale, result_type=ChatReply)
        except WorkflowUpdateFailedError as e:
            self.refusals.append(getattr(e.cause, "type", ""))
        right = ChatInput(messages=more, history_len=2, history_digest=history_digest(held, None))
        await handle.execute_update(CHAT_UPDATE, right, result_type=ChatReply)
        return RunAgentResult(reward=1.0)


async def test_a_request_continuing_a_history_the_workflow_does_not_hold_is_refused(
    bare_env: WorkflowEnvironment, queue_prefix: str
) -> None:
    s = DigestProbe(prefix=queue_prefix)
    inp = TrajectoryInput(task=agent_task(), seed=5, job_id="agent-digest", queue_prefix=queue_prefix)
    async with standin_workers(bare_env.client, s):
        result = await bare_env.client.execute_workflow(
            "TrajectoryWorkflow",
            inp,
            id=f"ag-{uuid.uuid4().hex[:8]}",
            task_queue=queue_name(Pool.CONTROL, queue_prefix),
            result_type=TrajectoryResult,
        )
    assert s.refusals == [TurnRefused.HISTORY_MISMATCH] and result.status == "completed" and result.turns == 2
    second = s.inputs("generate")[1]
    assert second.prefix_key and [m.content for m in second.messages or []] == ["more"]
