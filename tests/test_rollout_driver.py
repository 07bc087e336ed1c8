"""The rollout driver without a server: real env and reward activities in this process, a scripted generator.

The driver is what every workflow, `rollart eval` and the bench's plain loop run; here it runs over
`InProcessCalls`, so its logic — phases, masking, ids, single-turn failures per group — is checked in
milliseconds. (The same driver under Temporal: test_trajectory_workflow, test_training_workflow, test_replay.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.exceptions import ApplicationError

from rollart.activities.env import EnvActivities
from rollart.activities.reward import RewardActivities
from rollart.client.in_process import InProcessCalls
from rollart.contracts.activities import ActivityName, PromptsInput
from rollart.contracts.generation import Completion, GenerateBatchInput, GenerateInput, GenerateResult
from rollart.contracts.ids import member_id
from rollart.contracts.rollouts import GroupRolloutInput, GroupSeed, TrajectoryInput
from rollart.spec.chat import ChatMessage, ToolCall, ToolFunction
from rollart.spec.config import TaskSpec, resolve_task
from rollart.workflows.driver import lockstep
from rollart.workflows.driver.calls import CallFailed
from rollart.workflows.driver.episode import Episode
from rollart.workflows.driver.group import GroupEpisode
from rollart.workflows.driver.grouped import play_groups
from rollart.workflows.driver.lockstep import play
from rollart.workflows.driver.single_turn import play_single_turn
from tests.support.tasks import frozenlake_task


class ScriptedGenerator:
    """Answers every prompt with `text` (one completion per sample), or fails prompts containing `fail_on`."""

    def __init__(self, text: str = "right", fail_on: str | None = None) -> None:
        self.text, self.fail_on = text, fail_on

    def _result(self, prompt: str, key: str, n: int) -> GenerateResult:
        if self.fail_on is not None and self.fail_on in prompt:
            raise RuntimeError(f"engine died on {prompt!r}")
        return GenerateResult(
            completions=[Completion(text=self.text, num_tokens=1, finish_reason="stop")] * n,
            prompt_tokens=3,
            policy_version=0,
            policy_version_end=0,
            data_key=key,
        )

    async def generate(self, inp: GenerateInput) -> GenerateResult:
        return self._result(inp.prompt, inp.data_key, inp.sampling.n)

    async def generate_batch(self, inp: GenerateBatchInput) -> list[GenerateResult]:
        return [self._result(p, k, inp.sampling.n) for p, k in zip(inp.prompts, inp.data_keys)]


@pytest.fixture
async def envs() -> AsyncIterator[EnvActivities]:
    envs = EnvActivities("driver-test", queue="driver-test", env_threads=4)
    yield envs
    envs.shutdown()


def calls(envs: EnvActivities, gen: ScriptedGenerator | None = None) -> InProcessCalls:
    return InProcessCalls.of(envs, gen or ScriptedGenerator(), RewardActivities())


async def test_an_episode_plays_every_turn_then_scores_and_closes(envs: EnvActivities) -> None:
    c = calls(envs)
    task = frozenlake_task(max_turns=3, env_args={"maps": "standard", "invalid_action": "noop"})
    ep = Episode(c, TrajectoryInput(task=task, seed=1), "t-1")
    [result] = await play([ep])
    assert result.status == "completed" and result.trajectory_id == "t-1" and result.reward is not None
    assert result.turns == len(ep.turns) and 1 <= result.turns <= 3
    assert dict(c.counts) == {"reset": 1, "generate": result.turns, "step": result.turns, "reward": 1, "close": 1}


async def test_a_finished_episode_closes_its_session_while_it_is_scored(envs: EnvActivities) -> None:
    """close needs neither the score nor the report, so it runs alongside them (patch close-while-scoring)."""
    c, log = calls(envs), []
    call = c.call

    async def logged(activity: ActivityName, arg: BaseModel, **kw: Any) -> Any:
        log.append(("start", activity.value))
        try:
            return await call(activity, arg, **kw)
        finally:
            log.append(("end", activity.value))

    c.call = logged  # type: ignore[method-assign]
    reported: list[int] = []

    async def report(results: list) -> None:
        reported.append(len(log))

    ep = Episode(c, TrajectoryInput(task=frozenlake_task(max_turns=2), seed=1), "t-close")
    [result] = await play([ep], report)
    assert result.status == "completed" and c.counts["close"] == 1
    assert log.index(("start", "close")) < log.index(("end", "reward")), log
    assert reported and log.index(("end", "reward")) < reported[0], (log, reported)


async def test_a_broken_env_fails_its_episode_unscored_and_still_closes(envs: EnvActivities) -> None:
    c = calls(envs)
    ep = Episode(
        c,
        TrajectoryInput(task=frozenlake_task(env="tests.support.envs:BrokenStepEnv", env_args={}), seed=1),
        "t-broken",
    )
    [result] = await play([ep])
    assert result.status == "failed" and result.reward is None
    assert result.error is not None and result.error.startswith("step failed: EnvBroken")
    assert c.counts["reward"] == 0 and c.counts["close"] == 1


async def test_bad_input_fails_the_run_not_the_episode(envs: EnvActivities) -> None:
    c = calls(envs)
    with pytest.raises(ApplicationError) as err:
        await play([Episode(c, TrajectoryInput(task=frozenlake_task(env="nope"), seed=1), "t-nope")])
    assert err.value.type == "UnknownComponent" and err.value.non_retryable and "nope" in err.value.message


async def test_a_lockstep_batch_masks_only_the_failed_episode(envs: EnvActivities) -> None:
    c = calls(envs)
    good = TrajectoryInput(task=frozenlake_task(max_turns=2), seed=3)
    bad = TrajectoryInput(
        task=frozenlake_task(max_turns=2, env="tests.support.envs:BrokenStepEnv", env_args={}), seed=3
    )
    results = await play([Episode(c, good, "b-000"), Episode(c, bad, "b-001"), Episode(c, good, "b-002")])
    assert [r.status for r in results] == ["completed", "failed", "completed"]
    assert c.counts["reward"] == 2 and c.counts["close"] == 3


async def test_a_group_plays_in_one_session_under_the_ids_its_parent_gave(envs: EnvActivities) -> None:
    c = calls(envs)
    task = frozenlake_task(max_turns=3, group_size=4, rollout_unit="group")
    group = GroupSeed(group_id="g7", seed=7, member_ids=["a", "b", "c", "d"])
    results = await play([GroupEpisode(c, GroupRolloutInput(task=task, groups=[group]), group)])
    assert [r.trajectory_id for r in results] == ["a", "b", "c", "d"]
    assert all(r.status == "completed" and r.group_id == "g7" for r in results)
    turns = max(r.turns for r in results)
    assert c.counts["reset_group"] == 1 and c.counts["generate_batch"] == turns == c.counts["step_group"]
    assert c.counts["reward_batch"] == 1 and c.counts["close"] == 1


async def test_older_groups_name_their_members_as_the_parent_always_did() -> None:
    assert GroupSeed(group_id="g1", seed=0).members(3) == ["g1-0", "g1-1", "g1-2"]


async def test_a_wave_of_single_turn_groups_is_one_generate_batch(envs: EnvActivities) -> None:
    """In one process there is one engine: `live_engines` names no private queue, so the wave goes whole."""
    task = frozenlake_task(env="arithmetic", env_args={}, reward="exact_match", max_turns=1, group_size=3)
    c = calls(envs, ScriptedGenerator(text="0"))
    inp = GroupRolloutInput(task=task, groups=[GroupSeed(group_id=f"g{s}", seed=s) for s in range(5)])
    results = await play_single_turn(c, inp)
    assert [r.trajectory_id for r in results] == [f"g{s}-{m}" for s in range(5) for m in range(3)]
    assert all(r.status == "completed" for r in results)
    assert dict(c.counts) == {"prompts": 1, "live_engines": 1, "generate_batch": 1, "check": 1, "reward_batch": 1}


async def test_a_failed_single_turn_generation_fails_only_its_group(envs: EnvActivities) -> None:
    """The wave's generate_batch fails; each group is then generated on its own, and only the failing one fails."""
    task = frozenlake_task(env="arithmetic", env_args={}, reward="exact_match", max_turns=1, group_size=2)
    prompts = await calls(envs).call(ActivityName.PROMPTS, PromptsInput(env=task.env, seeds=[11, 12, 13]), queue="cpu")
    gen = ScriptedGenerator(text="0", fail_on=prompts[1])  # the second group's prompt kills the engine
    c = calls(envs, gen)
    inp = GroupRolloutInput(task=task, groups=[GroupSeed(group_id=f"g{s}", seed=s) for s in (11, 12, 13)])
    results = await play_single_turn(c, inp)
    by_group = {g: [r.status for r in results if r.group_id == g] for g in ("g11", "g12", "g13")}
    assert by_group == {"g11": ["completed"] * 2, "g12": ["failed"] * 2, "g13": ["completed"] * 2}
    assert "engine died" in next(r.error for r in results if r.group_id == "g12")
    assert c.counts["generate_batch"] == 1 and c.counts["generate"] == 3
    assert c.counts["check"] == 1 and c.counts["reward_batch"] == 1


class FailingBatches(InProcessCalls):
    """In-process calls whose generate_batch fails for good as `failure` says (a timeout, a cancellation)."""

    failure: CallFailed

    async def call(self, activity: ActivityName, arg: BaseModel, **kwargs: Any) -> Any:
        if activity is ActivityName.GENERATE_BATCH:
            self.counts[activity.value] += 1
            raise self.failure
        return await super().call(activity, arg, **kwargs)


@pytest.mark.parametrize(
    "failure",
    [CallFailed("generate_batch", "timed out (HEARTBEAT)", timed_out=True), CallFailed("generate_batch", "Cancelled")],
    ids=["timeout", "cancelled"],
)
async def test_a_timed_out_or_cancelled_wave_generation_fails_every_group_of_the_wave(
    envs: EnvActivities, failure: CallFailed
) -> None:
    """A timeout concerns the engine, which per-group calls would wait on again, and a cancellation (the job
    ended) the whole wave: its groups all fail, and nothing more is called."""
    task = frozenlake_task(env="arithmetic", env_args={}, reward="exact_match", max_turns=1, group_size=2)
    c = FailingBatches.of(envs, ScriptedGenerator(), RewardActivities())
    c.failure = failure
    inp = GroupRolloutInput(task=task, groups=[GroupSeed(group_id=f"g{s}", seed=s) for s in (1, 2)])
    results = await play_single_turn(c, inp)
    assert [r.status for r in results] == ["failed"] * 4
    assert all(r.error == failure.message for r in results)
    # no per-group generate, nothing checked or scored
    assert dict(c.counts) == {"prompts": 1, "live_engines": 1, "generate_batch": 1}


class _StuckUnit:
    """A unit whose score never returns and whose close waits too: what a torn-down workflow leaves suspended."""

    def __init__(self) -> None:
        self.error: str | None = None
        self.calls = None  # never asked: nothing fails
        self.closed = asyncio.Event()

    owner_id = "stuck"
    playing = False

    async def start(self) -> None:
        await asyncio.Event().wait()

    async def score(self) -> list:
        await asyncio.Event().wait()
        return []

    async def close(self) -> None:
        await self.closed.wait()

    def results(self, scores: list | None) -> list:
        return []


async def test_a_finishing_unit_closed_by_the_worker_waits_for_nothing() -> None:
    """A worker that drops a workflow (shutdown, eviction) closes its coroutines: GeneratorExit goes through.

    Before, the finish's `finally: await closing` waited inside GeneratorExit: "coroutine ignored GeneratorExit".
    """
    unit = _StuckUnit()
    finishing = lockstep._finish(unit, None)  # type: ignore[arg-type]
    finishing.send(None)  # runs up to the score that never returns
    finishing.close()  # what the garbage collector does to a dropped workflow's coroutine: must not raise
    unit.closed.set()
    await asyncio.sleep(0)  # the close task started alongside may finish


async def test_a_playing_unit_closed_by_the_worker_waits_for_nothing() -> None:
    """The same for a unit torn down mid-play: its sessions are not closed from inside GeneratorExit."""
    unit = _StuckUnit()
    playing = play([unit])  # type: ignore[list-item]
    playing.send(None)  # runs up to the start that never returns
    playing.close()


class ChatReplies(ScriptedGenerator):
    """A chat turn's reply as an assistant message: a `calc` tool call first, then the final answer `text`; keeps
    each turn's input."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.inputs: list[GenerateInput] = []

    async def generate(self, inp: GenerateInput) -> GenerateResult:
        self.inputs.append(inp)
        result = self._result(inp.prompt, inp.data_key, 1)
        if inp.prefix_key is None:
            call = ToolCall(id="c0", function=ToolFunction(name="calc", arguments='{"expression": "1+2"}'))
            message = ChatMessage(role="assistant", tool_calls=[call])
        else:
            message = ChatMessage(role="assistant", content=self.text)
        said = Completion(text=message.content or "", num_tokens=1, finish_reason="stop", message=message)
        return result.model_copy(update={"completions": [said]})


@pytest.mark.integration  # the tool_calls env's calc runs in a sandboxed child process
async def test_a_chat_envs_group_plays_free_each_member_its_own_conversation(envs: EnvActivities) -> None:
    """A chat env's members play free (`group_play: free`): a session and a conversation each, its first turn the
    env's messages and tools, the next continuing its own first (`prefix_key`), no lockstep batch."""
    gen = ChatReplies("7")
    c = calls(envs, gen)
    task = resolve_task(
        TaskSpec(
            name="tc",
            env="tool_calls",
            env_args={"digits": 1, "num_terms": 2, "operators": "+", "invalid_action": "noop"},
            reward="success",
            tool_parser="hermes",
            max_turns=2,
            group_size=3,
            rollout_unit="group",
            group_play="free",
        )
    )
    inp = GroupRolloutInput(task=task, groups=[GroupSeed(group_id="g", seed=3)], group_play="free")
    results = await play_groups(c, inp, None)
    assert sorted(r.trajectory_id for r in results) == [member_id("g", m) for m in range(3)]
    assert all(r.status == "completed" and r.turns == 2 for r in results), results
    assert c.counts["reset"] == c.counts["close"] == 3 and c.counts["generate_batch"] == 0
    firsts = [g for g in gen.inputs if g.prefix_key is None]
    assert len(firsts) == 3 and all(g.messages and g.messages[0].role == "user" and g.tools for g in firsts)
    continued = [g for g in gen.inputs if g.prefix_key]
    assert len(continued) == 3 and all(g.messages and g.messages[0].role == "tool" for g in continued)
    assert all(g.prefix_key.rsplit("turn-", 1)[0] == g.data_key.rsplit("turn-", 1)[0] for g in continued)
