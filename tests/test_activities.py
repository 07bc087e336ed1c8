"""Activities in isolation (Temporal's ActivityEnvironment): env sessions, generation bookkeeping, rewards."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from rollart.activities.engines.base import Completion as EngineCompletion
from rollart.activities.engines.base import Engine, EngineOutput, EngineRequestError
from rollart.activities.env import EnvActivities
from rollart.activities.generate import GenerateActivities
from rollart.activities.reward import RewardActivities
from rollart.contracts.activities import (
    CheckInput,
    CloseInput,
    EnvOptions,
    GroupResetInput,
    GroupStepInput,
    PromptsInput,
    ResetInput,
    RewardInput,
    RewardResult,
    StepInput,
    Transcript,
    TurnRecord,
)
from rollart.contracts.generation import GenerateInput
from rollart.infra.store.payload import LocalStore
from rollart.infra.store.weights import WeightsSource
from rollart.spec.config import SamplingParams
from rollart.spec.env import Env, StepOutcome

ENV = ActivityEnvironment()


async def test_env_session_lifecycle_is_sticky_to_its_worker() -> None:
    acts = EnvActivities("w1", queue="cpu@w1")
    handle = await ENV.run(
        acts.reset, ResetInput(env="frozenlake", env_args={"maps": "standard"}, seed=0, trajectory_id="t1")
    )
    assert handle.queue == "cpu@w1" and handle.worker_id == "w1"
    assert handle.observation == "AFFF\nFHFH\nFFFH\nHFFG\nmove:"
    step = await ENV.run(acts.step, StepInput(session_id=handle.session_id, action="R"))
    assert step.observation.startswith("SAFF") and not step.done and step.info["valid"]
    assert acts.open_sessions == 1
    await ENV.run(acts.close, CloseInput(session_id=handle.session_id))
    await ENV.run(acts.close, CloseInput(session_id=handle.session_id))  # idempotent
    assert acts.open_sessions == 0
    with pytest.raises(ApplicationError) as err:
        await ENV.run(acts.step, StepInput(session_id=handle.session_id, action="R"))
    assert err.value.type == "SessionLost" and err.value.non_retryable


async def test_group_session_steps_only_the_members_still_playing() -> None:
    acts = EnvActivities("w1", queue="cpu@w1")
    handle = await ENV.run(
        acts.reset_group, GroupResetInput(env="frozenlake", env_args={"maps": "standard"}, seed=0, size=3, group_id="g")
    )
    assert handle.queue == "cpu@w1" and handle.observations == ["AFFF\nFHFH\nFFFH\nHFFG\nmove:"] * 3
    assert acts.open_sessions == 1  # one session for the whole group
    steps = await ENV.run(acts.step_group, GroupStepInput(session_id=handle.session_id, actions=["R", "D", None]))
    assert (
        steps[0].observation.startswith("SAFF") and steps[1].observation.startswith("SFFF\nAHFH") and steps[2] is None
    )
    steps = await ENV.run(acts.step_group, GroupStepInput(session_id=handle.session_id, actions=[None, "R", "R"]))
    assert steps[0] is None and steps[1].done and not steps[1].info["success"]  # member 1 fell in the hole at (1,1)
    with pytest.raises(ApplicationError) as err:  # a step after done is a caller bug
        await ENV.run(acts.step_group, GroupStepInput(session_id=handle.session_id, actions=[None, "R", None]))
    assert err.value.type == "InvalidInput"
    with pytest.raises(ApplicationError) as err:
        await ENV.run(acts.step_group, GroupStepInput(session_id=handle.session_id, actions=["R"]))
    assert err.value.type == "InvalidInput" and "3" in err.value.message
    await ENV.run(acts.close, CloseInput(session_id=handle.session_id))
    assert acts.open_sessions == 0


async def test_group_members_reset_and_step_concurrently() -> None:
    """Each member's reset and step waits for the others to be in the same call: sequential calls would deadlock."""
    acts = EnvActivities("w1", queue="cpu@w1")
    handle = await ENV.run(
        acts.reset_group,
        GroupResetInput(env="tests.support.envs:RendezvousEnv", env_args={"members": 4}, seed=0, size=4, group_id="g"),
    )
    assert handle.observations == ["ready"] * 4
    steps = await ENV.run(acts.step_group, GroupStepInput(session_id=handle.session_id, actions=["a", "b", "c", "d"]))
    assert [s.observation for s in steps] == ["stepped"] * 4


async def test_a_retried_group_step_does_not_step_a_member_twice() -> None:
    """A transient fault in one member fails the call; its retry (same activity, next attempt) steps only the rest."""
    from tests.support.envs import FlakyStepEnv

    acts = EnvActivities("w1", queue="cpu@w1")
    FlakyStepEnv.instances.clear()
    handle = await ENV.run(
        acts.reset_group, GroupResetInput(env="tests.support.envs:FlakyStepEnv", seed=0, size=3, group_id="g")
    )
    FlakyStepEnv.failures = {2: 1}  # the last member: the others have stepped when it fails
    first, retry = ActivityEnvironment(), ActivityEnvironment()
    retry.info = dataclasses.replace(first.info, attempt=2)
    with pytest.raises(ApplicationError) as err:
        await first.run(acts.step_group, GroupStepInput(session_id=handle.session_id, actions=["a", "b", "c"]))
    assert err.value.type == "EnvStepTransient"
    steps = await retry.run(acts.step_group, GroupStepInput(session_id=handle.session_id, actions=["a", "b", "c"]))
    assert [env.steps for env in FlakyStepEnv.instances] == [1, 1, 1]
    assert [s.observation for s in steps] == ["step 1"] * 3
    steps = await ENV.run(acts.step_group, GroupStepInput(session_id=handle.session_id, actions=["a", None, "c"]))
    assert [env.steps for env in FlakyStepEnv.instances] == [2, 1, 2] and steps[1] is None  # the next turn steps again


async def test_env_errors_are_sorted_into_bad_input_and_broken_env() -> None:
    acts = EnvActivities("w1", queue="cpu@w1")
    cases = [
        (ResetInput(env="nope", seed=0, trajectory_id="t"), "UnknownComponent", "unknown env 'nope'"),
        (ResetInput(env="frozenlake", env_args={"size": 99}, seed=0, trajectory_id="t"), "InvalidInput", "size"),
    ]
    for inp, kind, fragment in cases:
        with pytest.raises(ApplicationError) as err:
            await ENV.run(acts.reset, inp)
        assert err.value.type == kind and err.value.non_retryable and fragment in err.value.message

    handle = await ENV.run(acts.reset, ResetInput(env="tests.support.envs:BrokenStepEnv", seed=0, trajectory_id="t"))
    with pytest.raises(ApplicationError) as err:
        await ENV.run(acts.step, StepInput(session_id=handle.session_id, action="L"))
    assert err.value.type == "EnvBroken" and err.value.non_retryable and "simulated sandbox crash" in err.value.message


class ClosingEnv(Env):
    """Remembers every instance and the thread that closed it; raises in reset for `bad_seed`, in step on "boom"."""

    built: ClassVar[list[ClosingEnv]] = []

    def __init__(self, bad_seed: int = -1, **env_args: Any) -> None:
        super().__init__(**env_args)
        self.bad_seed = bad_seed
        self.closed_on: str | None = None
        ClosingEnv.built.append(self)

    def reset(self, seed: int) -> str:
        if seed == self.bad_seed:
            raise RuntimeError(f"reset({seed}) failed")
        return f"seed {seed}"

    def step(self, action: str) -> StepOutcome:
        if action == "boom":
            raise RuntimeError("step failed")
        return StepOutcome(observation="end", reward=1.0, done=True, info={})

    def close(self) -> None:
        self.closed_on = threading.current_thread().name


async def test_throwaway_envs_are_closed_off_the_event_loop_even_when_they_raise() -> None:
    """`prompts` and `check` close every env they build, whatever happens, on the env threads (not the loop's)."""
    acts = EnvActivities("w1", queue="cpu@w1")
    name = "tests.test_activities:ClosingEnv"
    ClosingEnv.built.clear()
    assert await ENV.run(acts.prompts, PromptsInput(env=name, seeds=[1, 2])) == ["seed 1", "seed 2"]
    with pytest.raises(ApplicationError, match=r"reset\(seed=3\) raised"):
        await ENV.run(acts.prompts, PromptsInput(env=name, env_args={"bad_seed": 3}, seeds=[1, 3, 4]))
    results = await ENV.run(acts.check, CheckInput(env=name, seeds=[1], answers=[["a", "b"]]))
    assert [r.reward for r in results[0]] == [1.0, 1.0]
    with pytest.raises(ApplicationError) as err:
        await ENV.run(acts.check, CheckInput(env=name, seeds=[1, 2], answers=[["a"], ["boom", "c"]]))
    assert err.value.type == "EnvBroken"
    with pytest.raises(ApplicationError, match=r"reset\(seed=3\) raised"):
        await ENV.run(acts.check, CheckInput(env=name, env_args={"bad_seed": 3}, seeds=[3], answers=[["a"]]))
    loop_thread = threading.current_thread().name
    assert len(ClosingEnv.built) == 2 + 2 + 2 + 2 + 1
    assert all(e.closed_on is not None and e.closed_on != loop_thread for e in ClosingEnv.built), [
        e.closed_on for e in ClosingEnv.built
    ]
    acts.shutdown()


async def test_spares_the_reset_pool_drops_are_closed_off_the_event_loop() -> None:
    """Spares the pre-reset pool expires are closed on the env threads, not the event loop (a close may be slow)."""
    acts = EnvActivities("w1", queue="cpu@w1")
    name = "tests.test_activities:ClosingEnv"
    ClosingEnv.built.clear()
    options = EnvOptions(reset_pool_size=3)  # a reset hedges with 3 envs: one answers, two stay as spares
    await ENV.run(acts.reset, ResetInput(env=name, seed=5, trajectory_id="t0", options=options))
    await asyncio.sleep(0.2)  # the late hedges land as spares
    assert len(ClosingEnv.built) == 3
    acts.pool.max_idle_s = 0.0  # every spare is now stale: the next reset drops them
    await ENV.run(acts.reset, ResetInput(env=name, seed=6, trajectory_id="t1", options=options))
    for _ in range(100):
        if sum(e.closed_on is not None for e in ClosingEnv.built) >= 2:
            break
        await asyncio.sleep(0.02)
    dropped = [e.closed_on for e in ClosingEnv.built if e.closed_on is not None]
    assert len(dropped) >= 2 and threading.current_thread().name not in dropped, dropped
    acts.shutdown()


class ScriptedEngine(Engine):
    """Answers every prompt with one fixed completion; can reject requests like a real engine."""

    def __init__(self, reject: bool = False, seconds: float = 0.0) -> None:
        self.reject, self.seconds = reject, seconds

    async def start(self) -> None:
        pass

    async def generate(self, prompt: str, sampling: SamplingParams, request_id: str, priority: int = 0) -> EngineOutput:
        if self.reject:
            raise EngineRequestError("prompt too long")
        await asyncio.sleep(self.seconds)
        return EngineOutput([1, 2, 3], [EngineCompletion([7, 8], [-0.5, -1.5], "R", "length")], 3, 4)

    async def shutdown(self) -> None:
        pass

    def tokens_generated(self) -> int:
        return 0

    async def load_weights(self, source: WeightsSource | None, version: int, *, force: bool = False) -> None:
        self.loads = [*getattr(self, "loads", []), (source.manifest.version if source else None, version, force)]
        self.policy_version = version


async def test_generate_keeps_bulk_data_in_the_store(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    acts = GenerateActivities(ScriptedEngine(), store, "h800-w", tmp_path)
    result = await ENV.run(acts.generate, GenerateInput(prompt="p", sampling=SamplingParams(), data_key="t/turn-000"))
    assert [c.text for c in result.completions] == ["R"] and result.completions[0].num_tokens == 2
    assert (result.policy_version, result.policy_version_end, result.prompt_tokens) == (3, 4, 3)
    record = store.get_json("t/turn-000")
    assert record["prompt_ids"] == [1, 2, 3]
    assert record["completions"][0] == {
        "text": "R",
        "token_ids": [7, 8],
        "logprobs": [-0.5, -1.5],
        "finish_reason": "length",
    }


@pytest.mark.parametrize(("timeout_s", "beats"), [(3.0, 1), (None, 0)])
async def test_generate_beats_every_third_of_its_heartbeat_timeout(
    tmp_path: Path, timeout_s: float | None, beats: int
) -> None:
    """A turn of 1.5 s beats once (at 1 s) under a 3 s heartbeat timeout (the job's `engine.affinity.heartbeat_s`);
    without one (in-process calls) it beats every 20 s, so not at all."""
    env = ActivityEnvironment()
    if timeout_s is not None:
        env.info = dataclasses.replace(env.info, heartbeat_timeout=timedelta(seconds=timeout_s))
    sent: list[Any] = []
    env.on_heartbeat = lambda *details: sent.append(details)
    acts = GenerateActivities(ScriptedEngine(seconds=1.5), LocalStore(tmp_path), "h800-w", tmp_path)
    await env.run(acts.generate, GenerateInput(prompt="p", sampling=SamplingParams(), data_key="t/turn-000"))
    assert len(sent) == beats


async def test_generate_rejected_requests_are_not_retried(tmp_path: Path) -> None:
    acts = GenerateActivities(ScriptedEngine(reject=True), LocalStore(tmp_path), "h800-w", tmp_path)
    with pytest.raises(ApplicationError) as err:
        await ENV.run(acts.generate, GenerateInput(prompt="p", sampling=SamplingParams(), data_key="t/turn-000"))
    assert err.value.type == "RequestRejected" and err.value.non_retryable


def transcript(*turns: dict) -> Transcript:
    return Transcript(
        task="t", seed=0, turns=[TurnRecord(observation="o", action=t.get("action", "L"), info=t) for t in turns]
    )


async def test_reward_activity_runs_builtin_and_user_rewards() -> None:
    acts = RewardActivities()
    won = transcript({"valid": True}, {"valid": False}, {"valid": True, "success": True})
    result = await ENV.run(acts.reward, RewardInput(reward="success", transcript=won))
    assert result.success and result.value == pytest.approx(1.0 + 0.1 * 2 / 3)
    lost = transcript({"valid": False}, {"valid": False})
    assert (await ENV.run(acts.reward, RewardInput(reward="success", transcript=lost))).value == 0.0
    exact = transcript({"answer": 12, "action": " 12 "})
    assert (await ENV.run(acts.reward, RewardInput(reward="exact_match", transcript=exact))).success
    with pytest.raises(ApplicationError) as err:
        await ENV.run(acts.reward, RewardInput(reward="sucess", transcript=won))
    assert err.value.type == "UnknownComponent" and err.value.non_retryable
    with pytest.raises(ApplicationError, match="needs the env to report info\\['answer'\\]"):
        await ENV.run(acts.reward, RewardInput(reward="exact_match", transcript=won))


def test_reward_values_are_normalised() -> None:
    assert RewardResult.of(1, "r").success and not RewardResult.of(0.5, "r").success
    for bad in (True, "1", None, float("nan")):
        with pytest.raises(ApplicationError):
            RewardResult.of(bad, "r")


async def test_generation_pulls_the_jobs_weights_and_never_serves_another_jobs(tmp_path: Path) -> None:
    from rollart.contracts.generation import WeightsRef
    from rollart.infra.store.weights import WeightsManifest, commit

    store = LocalStore(tmp_path / "store")
    engine = ScriptedEngine()
    acts = GenerateActivities(engine, store, "h800-w", tmp_path)

    def publish(job: str, version: int) -> None:
        commit(store, WeightsManifest(job_id=job, version=version, dtype="float32", buckets=[]))

    async def gen(job: str, v: int) -> None:
        inp = GenerateInput(
            prompt="p", sampling=SamplingParams(), data_key="k", weights=WeightsRef(job_id=job, min_version=v)
        )
        await ENV.run(acts.generate, inp)

    await gen("a", 0)  # the model dir's weights are v0 of any job: nothing to load
    assert getattr(engine, "loads", []) == []
    publish("a", 1)
    publish("a", 2)
    await gen("a", 1)  # behind: the latest published version is loaded
    assert engine.loads == [(2, 2, False)]
    await gen("a", 2)  # current: no load
    await gen("b", 0)  # another job: its v0 (the model dir's own weights), forced although 0 < 2
    assert engine.loads[-1] == (None, 0, True)
    with pytest.raises(ApplicationError) as err:
        await gen("b", 1)  # not published yet: retryable, says what is missing
    assert err.value.type == "WeightsNotPublished" and not err.value.non_retryable


def test_progress_rewards_getting_closer_but_less_than_success() -> None:
    from rollart.activities.envs.frozenlake import FrozenLake
    from rollart.activities.rewards.rule_based import progress

    def play(actions: str) -> RewardResult:
        env, turns = FrozenLake(), []
        obs = env.reset(0)
        for a in actions:
            out = env.step(a)
            turns.append(TurnRecord(observation=obs, action=a, env_reward=out.reward, done=out.done, info=out.info))
            obs = out.observation
            if out.done:
                break
        return progress(Transcript(task="t", seed=0, turns=turns))

    nowhere, closer, hole, won = play("LL"), play("RRD"), play("DR"), play("RRDDDR")
    assert won.success and won.value == pytest.approx(1.1)
    assert not closer.success and 0.1 < closer.value < 1.0
    assert closer.value > nowhere.value  # 3 of 6 moves covered vs none
    assert nowhere.value == pytest.approx(0.1)  # valid moves, no way covered
    # D then R: one move covered (distance 6 -> 5), then a hole; the farthest point reached counts
    assert hole.value == pytest.approx(0.1 + 0.4 * 1 / 6)
    back = play("DDUU")  # two moves covered, then back to the start: the farthest point still counts
    assert back.value == pytest.approx(0.1 + 0.4 * 2 / 6)
