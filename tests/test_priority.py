"""Trajectory-aware priority (`engine.priority`): the pure rank, and the rollout driver putting it on each request.

The engine side (vLLM's priority scheduler serving lower ranks first) is test_engines.py's
`test_vllm_serves_waiting_requests_of_lower_priority_first`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from rollart.activities.env import EnvActivities
from rollart.activities.reward import RewardActivities
from rollart.client.in_process import InProcessCalls
from rollart.client.rollout import plan_trajectories
from rollart.contracts.activities import Completion, GenerateBatchInput, GenerateInput, GenerateResult
from rollart.contracts.rollouts import GroupRolloutInput, GroupSeed, TrajectoryInput
from rollart.contracts.training import TrainingPlan
from rollart.infra.config import EngineConfig, JobSpec
from rollart.workflows.driver.episode import Episode
from rollart.workflows.driver.group import GroupEpisode
from rollart.workflows.driver.lockstep import play
from rollart.workflows.driver.priority import MAX_TURNS_RANKED, request_priority
from tests.support.tasks import frozenlake_task

LONG_GAME = {"maps": "standard", "invalid_action": "noop"}  # no move ends the episode: it plays every turn


def test_fifo_ranks_every_request_alike_and_turns_ranks_the_longest_first() -> None:
    assert [request_priority("fifo", t) for t in (0, 1, 7)] == [0, 0, 0]
    assert [request_priority("turns", t) for t in (0, 1, 7)] == [0, -1, -7]
    assert request_priority("turns", 10 * MAX_TURNS_RANKED) == -MAX_TURNS_RANKED


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
