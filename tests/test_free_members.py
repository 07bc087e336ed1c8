"""Group members free of lockstep (`group_play: free`): each member plays on its own, inside one group workflow.

The driver runs over in-process calls and real env activities; a scripted engine makes one member slow (or broken),
so the test can tell a member that waits for its group from one that does not.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from temporalio.exceptions import ApplicationError

from rollart.activities.env import EnvActivities
from rollart.activities.reward import RewardActivities
from rollart.client.in_process import InProcessCalls
from rollart.contracts.generation import Completion, GenerateInput, GenerateResult
from rollart.contracts.rollouts import GroupRolloutInput, GroupSeed, TrajectoryResult
from rollart.contracts.training import TrainingPlan
from rollart.spec.config import JobSpec, TrainingConfig
from rollart.spec.routing import Unit
from rollart.workflows.driver.free_members import play_free
from rollart.workflows.driver.group import GroupEpisode
from rollart.workflows.driver.lockstep import play
from rollart.workflows.training.admission import Group, Launch, child_input
from tests.support.tasks import frozenlake_task

TURNS = 3
STAY = {"maps": "standard", "invalid_action": "noop"}  # "wait" is no move: every member plays all its turns


class PerMemberEngine:
    """Answers "wait" to every turn; the slow member's turns take `slow_s`, the broken member's fail."""

    def __init__(self, slow: str = "", slow_s: float = 0.0, broken: str = "") -> None:
        self.slow, self.slow_s, self.broken = slow, slow_s, broken
        self.served: list[tuple[str, int]] = []  # (member, turn), in the order their generations finished

    async def generate(self, inp: GenerateInput) -> GenerateResult:
        member, turn = inp.data_key.split("/")[-2], int(inp.data_key.rsplit("-", 1)[1])
        if member == self.broken:
            raise RuntimeError(f"engine died serving {member}")
        if member == self.slow:
            await asyncio.sleep(self.slow_s)
        self.served.append((member, turn))
        completion = Completion(text="wait", num_tokens=1, finish_reason="stop")
        return GenerateResult(
            completions=[completion], prompt_tokens=3, policy_version=0, policy_version_end=0, data_key=inp.data_key
        )

    generate_batch = None  # free members never batch: each calls `generate` on its own


@pytest.fixture
async def envs() -> AsyncIterator[EnvActivities]:
    envs = EnvActivities("free-members-test", queue="free-members-test", env_threads=8)
    yield envs
    envs.shutdown()


def group_input(group_play: str = "free") -> tuple[GroupRolloutInput, GroupSeed]:
    task = frozenlake_task(max_turns=TURNS, group_size=4, rollout_unit="group", env_args=STAY, group_play=group_play)
    group = GroupSeed(group_id="g1", seed=1, member_ids=["m0", "m1", "m2", "m3"])
    return GroupRolloutInput(task=task, groups=[group], group_play=task.group_play), group


async def test_each_member_plays_in_its_own_session_and_the_group_reports_once(envs: EnvActivities) -> None:
    engine = PerMemberEngine()
    calls = InProcessCalls.of(envs, engine, RewardActivities())
    inp, group = group_input()
    reports: list[list[TrajectoryResult]] = []

    async def report(results: list[TrajectoryResult]) -> None:
        reports.append(results)

    results = await play_free(calls, inp, group, report)
    assert [r.trajectory_id for r in results] == ["m0", "m1", "m2", "m3"]
    assert all(r.status == "completed" and r.group_id == "g1" and r.turns == TURNS for r in results)
    assert reports == [results]  # one report, the whole group
    members = 4
    assert calls.counts == {
        "reset": members,
        "generate": members * TURNS,
        "step": members * TURNS,
        "reward": members,
        "close": members,
    }


async def test_a_slow_member_does_not_hold_the_others_back(envs: EnvActivities) -> None:
    """Free: the fast members play all their turns while the slow one plays its first. Lockstep: each turn of
    the fast members waits for the slow member's."""
    free = PerMemberEngine(slow="m0", slow_s=0.3)
    inp, group = group_input()
    await play_free(InProcessCalls.of(envs, free, RewardActivities()), inp, group, None)
    first_slow = free.served.index(("m0", 0))
    assert {(m, t) for m in ("m1", "m2", "m3") for t in range(TURNS)} <= set(free.served[:first_slow]), free.served

    lockstep = PerMemberEngine(slow="m0", slow_s=0.3)
    lockstep.generate_batch = _batch_of(lockstep)  # type: ignore[assignment]
    inp, group = group_input("lockstep")
    await play([GroupEpisode(InProcessCalls.of(envs, lockstep, RewardActivities()), inp, group)])
    first_slow = lockstep.served.index(("m0", 0))
    assert all(t == 0 for _, t in lockstep.served[:first_slow]), lockstep.served


def _batch_of(engine: PerMemberEngine):
    async def generate_batch(inp) -> list[GenerateResult]:
        one = [GenerateInput(prompt=p, sampling=inp.sampling, data_key=k) for p, k in zip(inp.prompts, inp.data_keys)]
        return list(await asyncio.gather(*(engine.generate(i) for i in one)))

    return generate_batch


async def test_a_failed_member_is_masked_and_the_others_complete(envs: EnvActivities) -> None:
    calls = InProcessCalls.of(envs, PerMemberEngine(broken="m2"), RewardActivities())
    inp, group = group_input()
    results = await play_free(calls, inp, group, None)
    assert [r.status for r in results] == ["completed", "completed", "failed", "completed"]
    failed = results[2]
    assert failed.reward is None and failed.error is not None and "engine died serving m2" in failed.error
    assert calls.counts["reward"] == 3 and calls.counts["close"] == 4  # its session is closed, it is not scored


async def test_bad_input_fails_the_group(envs: EnvActivities) -> None:
    calls = InProcessCalls.of(envs, PerMemberEngine(), RewardActivities())
    inp, group = group_input()
    bad = inp.model_copy(update={"task": inp.task.model_copy(update={"env": "nope"})})
    with pytest.raises(ApplicationError) as err:
        await play_free(calls, bad, group, None)
    assert err.value.type == "UnknownComponent" and err.value.non_retryable


@pytest.mark.parametrize("group_play", ["free", "lockstep"])
def test_the_training_workflow_starts_groups_as_their_task_says(group_play: str) -> None:
    task = frozenlake_task(group_size=2, rollout_unit="group", group_play=group_play)
    plan = TrainingPlan.of(JobSpec(name="j", tasks=[task], training=TrainingConfig(steps=1, batch_size=2)))
    launch = Launch(unit=Unit.GROUP, workflow_id="j-g0", groups=(Group("j-g0", task, 5),))
    inp = child_input(plan, launch, "j", 0, "j-train")
    assert isinstance(inp, GroupRolloutInput) and inp.group_play == group_play


def test_histories_without_the_field_replay_in_lockstep() -> None:
    """A GroupRolloutInput recorded before `group_play` existed plays as it did then."""
    task = frozenlake_task(group_size=2, rollout_unit="group", group_play="free")
    recorded = GroupRolloutInput(task=task, groups=[GroupSeed(group_id="g", seed=0)]).model_dump(mode="json")
    del recorded["group_play"]
    assert GroupRolloutInput.model_validate(recorded).group_play == "lockstep"
