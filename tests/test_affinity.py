"""Session affinity as plain code (workflows/driver/affinity.py): which queue each turn goes to, and when it falls
back to the pool's shared queue; the wave split; the config. Scripted calls, no server."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from rollart.contracts.activities import ActivityName, RewardResult, StepResult
from rollart.contracts.errors import ErrorType
from rollart.contracts.generation import Completion, EnginePressure, GenerateResult, LiveEnginesResult
from rollart.contracts.rollouts import GroupRolloutInput, GroupSeed, TrajectoryInput
from rollart.spec.config import AffinityConfig, EngineConfig
from rollart.workflows.driver.affinity import Pin, falls_back, generate_on, split_wave
from rollart.workflows.driver.calls import CallFailed
from rollart.workflows.driver.episode import Episode
from rollart.workflows.driver.group import GroupEpisode
from rollart.workflows.driver.single_turn import play_single_turn
from tests.support.tasks import frozenlake_task

SHARED = "h800"


def served(worker: str, key: str = "k", kv: float = 0.2, n: int = 1) -> GenerateResult:
    """What an engine worker answers: its id and private queue, and how loaded it is."""
    return GenerateResult(
        completions=[Completion(text="R", num_tokens=1, finish_reason="length")] * n,
        prompt_tokens=1,
        policy_version=0,
        policy_version_end=0,
        data_key=key,
        worker_id=worker,
        queue=f"h800@{worker}",
        pressure=EnginePressure(running=1, kv_usage=kv),
    )


class Engines:
    """`Calls` over scripted engines: the shared queue is served by `shared_by`, a private queue by its worker
    unless it is `gone` (a schedule-to-start timeout) or `busy` (EngineBusy); every call is recorded."""

    logger = logging.getLogger("test")

    def __init__(self, shared_by: list[str], gone: set[str] = frozenset(), busy: set[str] = frozenset()) -> None:
        self.shared_by, self.gone, self.busy = list(shared_by), set(gone), set(busy)
        self.log: list[tuple[str, str, float | None]] = []  # (activity, queue, start wait)
        self.heartbeats: list[float | None] = []  # each generation's heartbeat timeout
        self.live: list[str] = []  # what live_engines answers

    async def call(self, activity: ActivityName, arg: Any, *, queue: str, **kw: Any) -> Any:
        self.log.append((activity.value, queue, kw.get("start_wait_s")))
        if activity.value.startswith("generate"):
            self.heartbeats.append(kw.get("heartbeat_s"))
        if activity is ActivityName.LIVE_ENGINES:
            return LiveEnginesResult(queues=self.live)
        if activity is ActivityName.PROMPTS:
            return [f"{seed}+0=" for seed in arg.seeds]
        if activity is ActivityName.CHECK:
            return [[StepResult(observation="", reward=1.0, done=True)] * len(a) for a in arg.answers]
        if activity is ActivityName.REWARD_BATCH:
            return [RewardResult(value=1.0, success=True) for _ in arg.transcripts]
        if queue == SHARED:
            worker = self.shared_by.pop(0) if len(self.shared_by) > 1 else self.shared_by[0]
        else:
            worker = queue.split("@", 1)[1]
            if worker in self.gone:
                raise CallFailed(activity.value, "timed out (SCHEDULE_TO_START)", timed_out=True)
            if worker in self.busy:
                raise CallFailed(activity.value, "EngineBusy: 40 waiting", error_type=ErrorType.ENGINE_BUSY)
        keys = getattr(arg, "data_keys", None) or [getattr(arg, "data_key", "k")]
        results = [served(worker, key, n=arg.sampling.n) for key in keys]
        return results if activity is ActivityName.GENERATE_BATCH else results[0]

    def queues(self, activity: str = "generate") -> list[str]:
        return [q for a, q, _ in self.log if a == activity]


def test_what_falls_back_to_the_shared_queue() -> None:
    assert falls_back(CallFailed("generate", "timed out (SCHEDULE_TO_START)", timed_out=True))  # gone
    assert falls_back(CallFailed("generate", "timed out (HEARTBEAT)", timed_out=True))  # died mid-call
    assert falls_back(CallFailed("generate", "busy", error_type=ErrorType.ENGINE_BUSY))
    assert falls_back(CallFailed("generate", "dead", error_type="EngineDeadError"))  # its retries ran out there
    assert not falls_back(CallFailed("generate", "too long", error_type=ErrorType.REQUEST_REJECTED))  # anywhere
    assert not falls_back(CallFailed("generate", "bad", error_type=ErrorType.INVALID_INPUT))
    assert not falls_back(CallFailed("generate", "Cancelled"))  # the caller is going away


def test_a_pin_follows_the_engine_that_served_and_counts_moves() -> None:
    pin, on = Pin(), AffinityConfig()
    assert pin.target(on) is None  # first turn: the shared queue
    pin.follow(served("a"))
    assert pin.target(on) == "h800@a" and pin.moves == 0 and pin.pressure == served("a").pressure
    pin.follow(served("a"))
    pin.follow(served("b"))
    assert pin.target(on) == "h800@b" and pin.worker == "b" and pin.moves == 1
    assert pin.target(AffinityConfig(mode="none")) is None  # off: always the shared queue


async def test_later_turns_go_to_the_first_turns_engine() -> None:
    c, pin = Engines(shared_by=["a", "b"]), Pin()
    for _ in range(3):
        await generate_on(
            c, AffinityConfig(start_wait_s=1.5), pin, ActivityName.GENERATE, _arg(), shared=SHARED, result_type=None
        )
    assert c.log == [("generate", SHARED, None), ("generate", "h800@a", 1.5), ("generate", "h800@a", 1.5)]
    assert pin.moves == 0


@pytest.mark.parametrize("trouble", ["gone", "busy"])
async def test_a_gone_or_busy_engine_sends_the_turn_to_the_shared_queue_and_the_trajectory_repins(
    trouble: str,
) -> None:
    c, pin = Engines(shared_by=["b"], **{trouble: {"a"}}), Pin(queue="h800@a", worker="a")
    out = await generate_on(c, AffinityConfig(), pin, ActivityName.GENERATE, _arg(), shared=SHARED, result_type=None)
    assert out.worker_id == "b" and c.queues() == ["h800@a", SHARED]
    assert pin.queue == "h800@b" and pin.moves == 1
    assert c.heartbeats == [60.0, 60.0]  # a turn on either queue is lost after the job's heartbeat timeout


async def test_a_turn_takes_the_jobs_heartbeat_timeout_on_every_queue() -> None:
    c, pin = Engines(shared_by=["a"]), Pin()
    for _ in range(2):
        await generate_on(
            c, AffinityConfig(heartbeat_s=6), pin, ActivityName.GENERATE, _arg(), shared=SHARED, result_type=None
        )
    assert c.queues() == [SHARED, "h800@a"] and c.heartbeats == [6.0, 6.0]
    await play_single_turn(c, wave(1, heartbeat_s=6))  # type: ignore[arg-type]
    assert c.heartbeats[2:] == [6.0]


async def test_a_rejected_request_is_not_retried_elsewhere() -> None:
    class Rejecting(Engines):
        async def call(self, activity: ActivityName, arg: BaseModel, *, queue: str, **kw: Any) -> Any:
            self.log.append((activity.value, queue, kw.get("start_wait_s")))
            raise CallFailed(activity.value, "too long", error_type=ErrorType.REQUEST_REJECTED)

    c, pin = Rejecting(shared_by=["a"]), Pin(queue="h800@a", worker="a")
    with pytest.raises(CallFailed):
        await generate_on(c, AffinityConfig(), pin, ActivityName.GENERATE, _arg(), shared=SHARED, result_type=None)
    assert c.queues() == ["h800@a"]


async def test_without_affinity_every_turn_goes_to_the_shared_queue_and_moves_are_counted() -> None:
    c, pin = Engines(shared_by=["a", "b", "a"]), Pin()
    for _ in range(3):
        await generate_on(
            c, AffinityConfig(mode="none"), pin, ActivityName.GENERATE, _arg(), shared=SHARED, result_type=None
        )
    assert c.queues() == [SHARED] * 3 and pin.moves == 2


async def test_an_episodes_result_names_its_engine_moves_and_pressure() -> None:
    c = Engines(shared_by=["a", "b"], gone={"a"})  # a serves the first turn, then is gone: b serves the second
    ep = Episode(c, TrajectoryInput(task=frozenlake_task(max_turns=3), seed=1), "t")  # type: ignore[arg-type]
    for _ in range(2):
        await ep.generate()
        ep._pending = None
    r = ep.result(status="failed", error="x")
    assert c.queues() == [SHARED, "h800@a", SHARED]
    assert r.engine_worker == "b" and r.engine_moves == 1 and r.pressure == served("b").pressure


async def test_a_lockstep_groups_members_share_one_engine() -> None:
    c = Engines(shared_by=["a", "b"])
    task = frozenlake_task(max_turns=3, group_size=3, rollout_unit="group")
    seed = GroupSeed(group_id="g", seed=0)
    group = GroupEpisode(c, GroupRolloutInput(task=task, groups=[seed]), seed)  # type: ignore[arg-type]
    for _ in range(2):
        await group.generate()
    assert c.queues("generate_batch") == [SHARED, "h800@a"]
    assert {ep.result(status="failed").engine_worker for ep in group.members} == {"a"}


def test_a_wave_splits_evenly_over_the_live_engines() -> None:
    assert split_wave(5, []) == [(None, range(5))]
    assert split_wave(5, ["q1"]) == [(None, range(5))]  # one engine: the shared queue, whoever is free
    assert split_wave(1, ["q1", "q2"]) == [(None, range(1))]
    assert split_wave(5, ["q1", "q2"]) == [("q1", range(0, 2)), ("q2", range(2, 5))]
    assert split_wave(2, ["q1", "q2", "q3"], offset=2) == [("q3", range(0, 1)), ("q1", range(1, 2))]
    shares = split_wave(16, ["a", "b", "c"])
    assert sorted(i for _, idx in shares for i in idx) == list(range(16))
    assert {len(idx) for _, idx in shares} <= {5, 6}


def wave(groups: int, **affinity: Any) -> GroupRolloutInput:
    task = frozenlake_task(env="arithmetic", env_args={}, reward="exact_match", max_turns=1, group_size=2)
    seeds = [GroupSeed(group_id=f"g{i}", seed=i) for i in range(groups)]
    return GroupRolloutInput(task=task, groups=seeds, affinity=AffinityConfig(**affinity))


async def test_a_single_turn_wave_is_shared_by_the_live_engines() -> None:
    c = Engines(shared_by=["a"])
    c.live = ["h800@a", "h800@b"]
    results = await play_single_turn(c, wave(5))  # type: ignore[arg-type]
    asked = [a for a, _, _ in c.log]
    assert asked == ["prompts", "live_engines", "generate_batch", "generate_batch", "check", "reward_batch"]
    assert sorted(c.queues("generate_batch")) == ["h800@a", "h800@b"]
    assert [r.status for r in results] == ["completed"] * 10
    assert {r.group_id: r.engine_worker for r in results} == {"g0": "a", "g1": "a", "g2": "b", "g3": "b", "g4": "b"}


async def test_a_share_whose_engine_is_gone_goes_to_the_shared_queue() -> None:
    c = Engines(shared_by=["a"], gone={"b"})
    c.live = ["h800@a", "h800@b"]  # b was killed a moment ago: its heartbeat has not lapsed yet
    results = await play_single_turn(c, wave(4))  # type: ignore[arg-type]
    assert sorted(c.queues("generate_batch")) == [SHARED, "h800@a", "h800@b"]
    assert [r.status for r in results] == ["completed"] * 8 and {r.engine_worker for r in results} == {"a"}


@pytest.mark.parametrize("case", ["off", "one group", "one engine"])
async def test_a_wave_goes_whole_to_the_shared_queue_when_it_cannot_split(case: str) -> None:
    c = Engines(shared_by=["a"])
    c.live = ["h800@a"] if case == "one engine" else ["h800@a", "h800@b"]
    inp = wave(1 if case == "one group" else 3, mode="none" if case == "off" else "session")
    await play_single_turn(c, inp)  # type: ignore[arg-type]
    assert c.queues("generate_batch") == [SHARED]
    assert bool(c.queues("live_engines")) == (case == "one engine")  # asked only when the wave could split


def test_the_affinity_config_reads_well_and_names_bad_values() -> None:
    assert EngineConfig.model_validate({"affinity": "none"}).affinity.mode == "none"
    assert EngineConfig().affinity == AffinityConfig(mode="session", start_wait_s=2.0, max_waiting=32)
    with pytest.raises(ValidationError, match=r"affinity\.mode"):
        EngineConfig.model_validate({"affinity": "sticky"})
    with pytest.raises(ValidationError, match="start_wait_s"):
        AffinityConfig(start_wait_s=0)
    with pytest.raises(ValidationError, match="heartbeat_s"):  # beats every third: under 1 s each is too often
        AffinityConfig(heartbeat_s=2)


def _arg() -> BaseModel:
    from rollart.contracts.generation import GenerateInput
    from rollart.spec.config import SamplingParams

    return GenerateInput(prompt="p", sampling=SamplingParams(), data_key="k")
