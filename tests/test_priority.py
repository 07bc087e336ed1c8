"""Trajectory-aware priority (`engine.priority`): the pure rank, and the rollout driver putting it on each request.

The engine side (vLLM's priority scheduler serving lower ranks first) is test_engines.py's
`test_vllm_serves_waiting_requests_of_lower_priority_first`; the task queue's, on a real dev server, is here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from temporalio import activity
from temporalio.worker import Worker

from rollart.activities.env import EnvActivities
from rollart.activities.reward import RewardActivities
from rollart.client.in_process import InProcessCalls
from rollart.client.rollout import plan_trajectories
from rollart.contracts.generation import Completion, GenerateBatchInput, GenerateInput, GenerateResult
from rollart.contracts.rollouts import GroupRolloutInput, GroupSeed, TrajectoryInput
from rollart.contracts.training import TrainingPlan
from rollart.spec.config import EngineConfig, JobSpec
from rollart.workflows.driver.episode import Episode
from rollart.workflows.driver.group import GroupEpisode
from rollart.workflows.driver.lockstep import play
from rollart.workflows.driver.priority import MAX_TURNS_RANKED, queue_priority_key, request_priority
from tests.support.ranked_requests import RankedRequests
from tests.support.tasks import frozenlake_task

LONG_GAME = {"maps": "standard", "invalid_action": "noop"}  # no move ends the episode: it plays every turn


def test_fifo_ranks_every_request_alike_and_turns_ranks_the_longest_first() -> None:
    assert [request_priority("fifo", t) for t in (0, 1, 7)] == [0, 0, 0]
    assert [request_priority("turns", t) for t in (0, 1, 7)] == [0, -1, -7]
    assert request_priority("turns", 10 * MAX_TURNS_RANKED) == -MAX_TURNS_RANKED


def test_predicted_ranks_the_longest_predicted_first_and_never_below_its_turns_done() -> None:
    assert [request_priority("predicted", 0, p) for p in (None, 2.4, 9.6)] == [0, -2, -10]
    assert [request_priority("predicted", t, 3) for t in (0, 3, 5)] == [-3, -3, -5]  # a prediction passed: its turns
    assert request_priority("fifo", 2, 9) == 0 and request_priority("turns", 2, 9) == -2  # only `predicted` reads it


def test_a_tasks_mean_length_is_kept_under_predicted_and_launched_with_its_groups() -> None:
    from rollart.contracts.rollouts import TrajectoryResult
    from rollart.contracts.training import InFlight, TrainingState
    from rollart.workflows.training import admission, lengths

    job = JobSpec(tasks=[frozenlake_task(group_size=2)], engine=EngineConfig(priority="predicted"))
    plan, state = TrainingPlan.of(job), TrainingState()
    state.in_flight = {f"t{i}": InFlight(group="g", workflow=f"t{i}") for i in range(3)}

    def done(tid: str, turns: int, status: str = "completed") -> TrajectoryResult:
        return TrajectoryResult(trajectory_id=tid, task="frozenlake", seed=0, status=status, turns=turns)

    lengths.observe(plan, state, [done("t0", 8), done("t1", 2, "failed"), done("gone", 30)])
    assert state.task_turns == {"frozenlake": 8.0}  # a failed one and a repeat (not in flight) are not counted
    lengths.observe(plan, state, [done("t2", 18)])
    assert state.task_turns["frozenlake"] == pytest.approx(9.0)  # 8 + 0.1 x (18 - 8)
    state.in_flight = {}
    launch = admission.launches(plan, state, "j")[0]
    assert admission.child_input(plan, launch, "j", 0, "j").predicted_turns == 9.0
    fifo = TrainingPlan.of(JobSpec(tasks=[frozenlake_task(group_size=2)]))
    lengths.observe(fifo, state := TrainingState(in_flight={"t0": InFlight(group="g", workflow="t0")}), [done("t0", 8)])
    assert state.task_turns == {} and lengths.predicted(fifo, state, "frozenlake") is None


@pytest.mark.parametrize(("policy", "turns", "says"), [("turns", -1, "turns_done"), ("lifo", 0, "unknown")])
def test_a_bad_policy_or_count_is_an_error_saying_which(policy: str, turns: int, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        request_priority(policy, turns)  # type: ignore[arg-type]


def test_the_jobs_engine_priority_reaches_every_rollout_input() -> None:
    job = JobSpec(tasks=[frozenlake_task()], engine=EngineConfig(priority="turns"))
    assert TrainingPlan.of(job).priority == "turns"
    assert {t.priority for t in plan_trajectories(job, 4, seed=0, job_id="j")} == {"turns"}
    assert JobSpec(tasks=[frozenlake_task()]).engine.priority == "fifo"  # the default


class RecordingGenerator:
    """Answers every prompt with an invalid move (a no-op in LONG_GAME) and records each request's priority."""

    def __init__(self) -> None:
        self.priorities: list[int] = []

    def _result(self, key: str) -> GenerateResult:
        completion = Completion(text="wait", num_tokens=1, finish_reason="stop")
        return GenerateResult(
            completions=[completion], prompt_tokens=3, policy_version=0, policy_version_end=0, data_key=key
        )

    async def generate(self, inp: GenerateInput) -> GenerateResult:
        self.priorities.append(inp.priority)
        return self._result(inp.data_key)

    async def generate_batch(self, inp: GenerateBatchInput) -> list[GenerateResult]:
        self.priorities.append(inp.priority)
        return [self._result(k) for k in inp.data_keys]


@pytest.fixture
async def envs() -> AsyncIterator[EnvActivities]:
    envs = EnvActivities("priority-test", queue="priority-test", env_threads=2)
    yield envs
    envs.shutdown()


@pytest.mark.parametrize(("policy", "expected"), [("fifo", [0, 0, 0, 0]), ("turns", [0, -1, -2, -3])])
async def test_an_episodes_turns_and_a_groups_batches_carry_their_rank(
    envs: EnvActivities, policy: str, expected: list[int]
) -> None:
    task = frozenlake_task(max_turns=4, group_size=2, env_args=LONG_GAME)
    gen = RecordingGenerator()
    calls = InProcessCalls.of(envs, gen, RewardActivities())
    [result] = await play([Episode(calls, TrajectoryInput(task=task, seed=1, priority=policy), "t-1")])
    assert result.status == "completed" and gen.priorities == expected
    gen.priorities.clear()
    group = GroupRolloutInput(task=task, groups=[GroupSeed(group_id="g-1", seed=1)], priority=policy)
    results = await play([GroupEpisode(calls, group, group.groups[0])])
    assert [r.status for r in results] == ["completed"] * 2 and gen.priorities == expected


async def test_a_free_members_length_predicts_its_siblings_and_a_groups_its_task_mean(envs: EnvActivities) -> None:
    """Free members: once the fast member has played all 4 turns, the slow ones' next requests rank as 4-turn
    trajectories (-4), not by their own turns done; a lockstep group starts at its task's mean."""
    from rollart.workflows.driver.free_members import play_free

    task = frozenlake_task(max_turns=4, group_size=3, env_args=LONG_GAME, rollout_unit="group", group_play="free")

    class SlowSiblings(RecordingGenerator):
        def __init__(self) -> None:
            super().__init__()
            self.by_member: dict[str, list[int]] = {}

        async def generate(self, inp: GenerateInput) -> GenerateResult:
            member = inp.data_key.split("/")[-2]
            self.by_member.setdefault(member, []).append(inp.priority)
            if member != "m0":
                await asyncio.sleep(0.1)  # m0 plays its 4 turns in the time the others play one
            return self._result(inp.data_key)

    gen = SlowSiblings()
    calls = InProcessCalls.of(envs, gen, RewardActivities())
    group = GroupSeed(group_id="g", seed=1, member_ids=["m0", "m1", "m2"])
    inp = GroupRolloutInput(task=task, groups=[group], priority="predicted", group_play="free", predicted_turns=2)
    results = await play_free(calls, inp, group, None)
    assert [r.status for r in results] == ["completed"] * 3
    assert gen.by_member["m0"] == [-2, -2, -2, -3]  # the task's mean (2) until its own turns pass it
    assert gen.by_member["m1"][0] == -2 and gen.by_member["m1"][-1] == -4  # after m0 finished: m0's 4 turns
    lockstep = GroupRolloutInput(task=task, groups=[group], priority="predicted", predicted_turns=3)
    gen.priorities.clear()
    await play([GroupEpisode(calls, lockstep, group)])
    assert gen.priorities == [-3, -3, -3, -3]  # the task's mean, then its turns done (3) as they pass it


def test_a_rank_becomes_a_task_queue_priority_key_and_fifo_sets_none() -> None:
    assert [queue_priority_key(request_priority("fifo", t)) for t in (0, 3)] == [None, None]
    assert [queue_priority_key(request_priority("turns", t)) for t in (0, 1, 2, 9)] == [None, 2, 1, 1]


@pytest.mark.orchestration
async def test_the_task_queue_serves_waiting_requests_of_lower_rank_first(bare_env, queue_prefix: str) -> None:
    """One generation slot; while it is busy (until all are scheduled: no race with the workflow's timer), 6
    first-turn requests then 6 ranked -2 (a trajectory 2 turns in) are queued. The dev server (one partition per
    queue, as every server rollart starts) hands the ranked ones out first. Under fifo the order would be the
    order of scheduling."""
    served: list[str] = []
    client, queue, workflow_id = bare_env.client, f"{queue_prefix}h800", f"{queue_prefix}ranked"
    ranks = [0] * 6 + [-2] * 6

    async def all_scheduled() -> None:
        """Until every request is on the queue (in the history), however slow the workflow's timer was."""
        for _ in range(400):
            history = await client.get_workflow_handle(workflow_id).fetch_history()
            kinds = [e.WhichOneof("attributes") for e in history.events]
            if kinds.count("activity_task_scheduled_event_attributes") == len(ranks) + 1:
                return
            await asyncio.sleep(0.05)
        raise TimeoutError("the ranked requests were never scheduled")

    @activity.defn(name="generate")
    async def generate(inp: GenerateInput) -> GenerateResult:
        served.append(inp.data_key)
        await (all_scheduled() if inp.data_key == "blocker" else asyncio.sleep(0.02))
        return GenerateResult(
            completions=[], prompt_tokens=0, policy_version=0, policy_version_end=0, data_key=inp.data_key
        )

    async with Worker(client, task_queue=f"{queue_prefix}control", workflows=[RankedRequests]):
        async with Worker(client, task_queue=queue, activities=[generate], max_concurrent_activities=1):
            await client.execute_workflow(
                RankedRequests.run, args=[queue, ranks], id=workflow_id, task_queue=f"{queue_prefix}control"
            )
    assert served[0] == "blocker" and len(served) == 13
    assert {k.split(":")[1] for k in served[1:7]} == {"-2"}, served
