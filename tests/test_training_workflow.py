"""TrainingWorkflow's loop against a real dev server, with stand-in activities (no engine, no torch).

Checks the invariants that make async training correct: versions advance, no
trajectory is trained on beyond the async bound or twice, the ledger balances
across continue-as-new, failures are masked, and batch mode is lockstep.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from rollart.contracts.activities import (
    CheckInput,
    CloseInput,
    Completion,
    EnvHandle,
    GenerateBatchInput,
    GenerateInput,
    GenerateResult,
    GroupHandle,
    GroupResetInput,
    GroupStepInput,
    PromptsInput,
    ResetInput,
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
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests.support.tasks import frozenlake_task

SESSION_QUEUE = "cpu@stand-in"


@dataclass
class World:
    """Stand-in env/engine/reward/trainer; the 'engine' serves whatever version was last published."""

    version: int = 0
    fail_seeds: set[int] = field(default_factory=set)
    turn_delay_s: float = 0.0
    held_group: str | None = None  # this group's first generate_batch waits for another group's step_group
    broken_engine_group: str | None = None  # generate_batch fails for this group
    log: list[tuple[str, str]] = field(default_factory=list)  # (activity, trajectory or step)
    trained_ids: list[str] = field(default_factory=list)
    steps: list[TrainStepInput] = field(default_factory=list)
    _sessions: dict[str, int] = field(default_factory=dict)
    _group_turns: dict[str, int] = field(default_factory=dict)
    _other_group_stepped: asyncio.Event = field(default_factory=asyncio.Event)

    @activity.defn(name="reset")
    async def reset(self, inp: ResetInput) -> EnvHandle:
        self.log.append(("reset", inp.trajectory_id))
        sid = f"{inp.trajectory_id}/s"
        self._sessions[sid] = inp.seed
        return EnvHandle(session_id=sid, queue=SESSION_QUEUE, worker_id="w", observation="o")

    @activity.defn(name="generate")
    async def generate(self, inp: GenerateInput) -> GenerateResult:
        self.log.append(("generate", f"{inp.data_key} n={inp.sampling.n}"))
        assert inp.weights is None or self.version >= inp.weights.min_version
        await asyncio.sleep(self.turn_delay_s)
        return self._generation(inp.data_key, inp.sampling.n)

    @activity.defn(name="generate_batch")
    async def generate_batch(self, inp: GenerateBatchInput) -> list[GenerateResult]:
        self.log.append(("generate_batch", str(len(inp.prompts))))
        assert inp.weights is None or self.version >= inp.weights.min_version
        if self.broken_engine_group and f"{self.broken_engine_group}-" in inp.data_keys[0]:
            raise ApplicationError("engine crashed", type="EngineError", non_retryable=True)
        await asyncio.sleep(self.turn_delay_s)
        if self.held_group and f"{self.held_group}-" in inp.data_keys[0] and "turn-000" in inp.data_keys[0]:
            with contextlib.suppress(asyncio.TimeoutError):  # lockstep: no other group steps before this returns
                await asyncio.wait_for(self._other_group_stepped.wait(), 3)
            self.log.append(("held", "released" if self._other_group_stepped.is_set() else "timed out"))
        return [self._generation(key, inp.sampling.n) for key in inp.data_keys]

    def _generation(self, data_key: str, n: int) -> GenerateResult:
        return GenerateResult(completions=[Completion(text="R", num_tokens=1, finish_reason="length")] * n,
                              prompt_tokens=1, policy_version=self.version, policy_version_end=self.version,
                              data_key=data_key)  # fmt: skip

    @activity.defn(name="reset_group")
    async def reset_group(self, inp: GroupResetInput) -> GroupHandle:
        self.log.append(("reset_group", inp.group_id))
        sid = f"{inp.group_id}/s"
        self._sessions[sid] = inp.seed
        return GroupHandle(session_id=sid, queue=SESSION_QUEUE, worker_id="w", observations=["o"] * inp.size)

    @activity.defn(name="step_group")
    async def step_group(self, inp: GroupStepInput) -> list[StepResult | None]:
        """Member i of a group is done after i + 1 turns, so members drop out one by one."""
        self.log.append(("step_group", f"{inp.session_id} {sum(a is not None for a in inp.actions)}"))
        if self.held_group and f"{self.held_group}/" not in inp.session_id:
            self._other_group_stepped.set()
        if self._sessions[inp.session_id] in self.fail_seeds:
            raise ApplicationError("env crashed", type="EnvBroken", non_retryable=True)
        turn = self._group_turns[inp.session_id] = self._group_turns.get(inp.session_id, 0) + 1
        return [None if a is None else StepResult(observation="o", reward=0.0, done=turn > i)
                for i, a in enumerate(inp.actions)]  # fmt: skip

    @activity.defn(name="step")
    async def step(self, inp: StepInput) -> StepResult:
        self.log.append(("step", inp.session_id))
        if self._sessions[inp.session_id] in self.fail_seeds:
            raise ApplicationError("env crashed", type="EnvBroken", non_retryable=True)
        return StepResult(observation="o", reward=0.0, done=True, info={"success": True})

    @activity.defn(name="close")
    async def close(self, inp: CloseInput) -> None:
        self._sessions.pop(inp.session_id, None)

    @activity.defn(name="reward")
    async def reward(self, inp: RewardInput) -> RewardResult:
        self.log.append(("reward", inp.transcript.task))
        return RewardResult(value=1.0, success=True)

    @activity.defn(name="prompts")
    async def prompts(self, inp: PromptsInput) -> list[str]:
        self.log.append(("prompts", str(len(inp.seeds))))
        return [f"{seed}+0=" for seed in inp.seeds]

    @activity.defn(name="check")
    async def check(self, inp: CheckInput) -> list[list[StepResult]]:
        self.log.append(("check", str(len(inp.seeds))))
        return [[StepResult(observation="", reward=1.0, done=True, info={"answer": "R"}) for _ in a] for a in inp.answers]

    @activity.defn(name="reward_batch")
    async def reward_batch(self, inp: RewardBatchInput) -> list[RewardResult]:
        self.log.append(("reward_batch", str(len(inp.transcripts))))
        return [RewardResult(value=1.0, success=True) for _ in inp.transcripts]

    @activity.defn(name="train_step")
    async def train_step(self, inp: TrainStepInput) -> TrainStepResult:
        self.log.append(("train_step", str(inp.step)))
        self.steps.append(inp)
        self.trained_ids += [s.trajectory_id for s in inp.samples]
        await asyncio.sleep(0.05)
        self.version = inp.step + 1
        return TrainStepResult(step=inp.step, version=inp.step + 1, weights_key="k", metrics={"loss": 0.0})


@contextlib.asynccontextmanager
async def world_workers(client: Client, w: World) -> AsyncIterator[None]:
    async with contextlib.AsyncExitStack() as stack:
        for queue, kwargs in [
            ("control", {"workflows": ALL_WORKFLOWS}),
            ("cpu", {"activities": [w.reset, w.reset_group, w.prompts, w.check]}),
            (SESSION_QUEUE, {"activities": [w.step, w.step_group, w.close]}),
            ("h800", {"activities": [w.generate, w.generate_batch]}),
            ("h20", {"activities": [w.generate, w.generate_batch]}),
            ("serverless", {"activities": [w.reward, w.reward_batch]}),
            ("trainer", {"activities": [w.train_step]}),
        ]:
            await stack.enter_async_context(Worker(client, task_queue=queue, **kwargs))
        yield


def job(**training: object) -> JobSpec:
    task = frozenlake_task(group_size=2, max_turns=2)  # multi-turn: a TrajectoryWorkflow per member
    return JobSpec(name="wf", tasks=[task], training=TrainingConfig(**{"steps": 3, "batch_size": 4, **training}))


async def train(env: WorkflowEnvironment, w: World, spec: JobSpec) -> tuple[TrainingResult, TrainingStatus]:
    await ensure_registered(env.client)
    job_id = f"train-{uuid.uuid4().hex[:8]}"
    async with world_workers(env.client, w):
        handle = await env.client.start_workflow(
            "TrainingWorkflow", TrainingInput(job=spec, job_id=job_id, run_dir="/tmp/unused"), id=job_id,
            task_queue="control", result_type=TrainingResult,
        )  # fmt: skip
        result = await asyncio.wait_for(handle.result(), 120)
        status = await handle.query("status", result_type=TrainingStatus)
    return result, status


def assert_ledger(result: TrainingResult) -> None:
    assert result.started == (result.trained + result.dropped + result.failed + result.cancelled_in_flight
                              + result.buffered_unused)  # fmt: skip


@pytest.mark.parametrize("bound", [0, 1, 2])
async def test_versions_advance_within_the_bound(bare_env: WorkflowEnvironment, bound: int) -> None:
    w = World(turn_delay_s=0.02)
    result, status = await train(bare_env, w, job(async_bound=bound))
    assert [s.step for s in w.steps] == [0, 1, 2] and result.version == 3
    for s in w.steps:
        assert len(s.samples) == 4
        assert all(s.step - x.policy_version_min <= bound for x in s.samples)
        groups = {x.group_id for x in s.samples}
        assert all(sum(x.group_id == g for x in s.samples) == 2 for g in groups)  # whole GRPO groups
    assert len(w.trained_ids) == len(set(w.trained_ids)) == result.trained == 12
    assert_ledger(result)
    assert status.done and status.ledger_balanced
    assert [r.step for r in status.history] == [0, 1, 2]
    if bound == 0:  # synchronous: everything trained at step k was generated by policy k
        assert all(x.policy_version_min == s.step for s in w.steps for x in s.samples)


async def test_continue_as_new_every_step_conserves_trajectories(bare_env: WorkflowEnvironment) -> None:
    w = World(turn_delay_s=0.03)
    result, status = await train(bare_env, w, job(async_bound=2, steps=4, continue_as_new_every=1))
    assert result.version == 4 and [s.step for s in w.steps] == [0, 1, 2, 3]
    assert len(w.trained_ids) == len(set(w.trained_ids)) == result.trained
    assert_ledger(result)
    assert status.ledger_balanced


async def test_failed_trajectories_are_masked_not_scored(bare_env: WorkflowEnvironment) -> None:
    seeds = [0 * 1_000_003 + g for g in range(40)]
    w = World(fail_seeds=set(seeds[1::3]))  # every third group's env crashes
    result, _ = await train(bare_env, w, job(async_bound=1))
    assert result.failed > 0
    failed_ids = {tid for kind, tid in w.log if kind == "reset"} - set(w.trained_ids)
    assert failed_ids
    for s in w.steps:
        assert all(x.reward == 1.0 for x in s.samples)  # only completed trajectories reach the trainer
    assert_ledger(result)


async def test_batch_mode_is_lockstep(bare_env: WorkflowEnvironment) -> None:
    w = World()
    spec = job(async_bound=0, rollout_mode="batch", steps=2)
    spec = spec.model_copy(update={"tasks": [frozenlake_task(group_size=2, max_turns=3)]})
    result, _ = await train(bare_env, w, spec)
    assert result.version == 2 and result.trained == 8
    kinds = [k for k, _ in w.log if k != "train_step"]
    first_batch = kinds[: kinds.index("reward") + 4]
    # all 4 resets, then 4 generations, then 4 steps (the env says done after one step), then 4 rewards
    assert first_batch == ["reset"] * 4 + ["generate"] * 4 + ["step"] * 4 + ["reward"] * 4
    assert_ledger(result)


async def test_pause_resume_and_stop(bare_env: WorkflowEnvironment) -> None:
    await ensure_registered(bare_env.client)
    w = World(turn_delay_s=0.05)
    job_id = f"ctl-{uuid.uuid4().hex[:8]}"
    async with world_workers(bare_env.client, w):
        handle = await bare_env.client.start_workflow(
            "TrainingWorkflow", TrainingInput(job=job(async_bound=1, steps=1000), job_id=job_id, run_dir="/tmp/x"),
            id=job_id, task_queue="control", result_type=TrainingResult, start_signal="pause",
        )  # fmt: skip
        await asyncio.sleep(1.0)
        paused = await handle.query("status", result_type=TrainingStatus)
        assert paused.paused and paused.started == 0  # paused before the first launch: nothing started
        await handle.signal("resume")
        while (await handle.query("status", result_type=TrainingStatus)).step < 2:
            await asyncio.sleep(0.1)
        await handle.signal("stop")
        result = await asyncio.wait_for(handle.result(), 60)
    assert 2 <= result.version < 1000
    assert_ledger(result)


@pytest.mark.parametrize("mode", ["trajectory", "batch"])
async def test_single_turn_groups_take_a_few_activities_per_group(bare_env: WorkflowEnvironment, mode: str) -> None:
    """A multitask job: single-turn groups run as one generate with n = group size, plus batched calls."""
    w = World()
    math = frozenlake_task(name="math", env="arithmetic", env_args={}, reward="exact_match", generate_pool="h20",
                           max_turns=1, group_size=4)  # fmt: skip
    spec = job(async_bound=1, steps=3, batch_size=8, rollout_mode=mode)
    spec = spec.model_copy(update={"tasks": [frozenlake_task(group_size=4, max_turns=2, weight=1.0), math]})
    result, status = await train(bare_env, w, spec)
    assert result.version == 3 and status.ledger_balanced
    math_samples = [x for s in w.steps for x in s.samples if x.task == "math"]
    assert math_samples, "the weighted draw never picked the single-turn task"
    assert sorted({x.completion_index for x in math_samples}) == [0, 1, 2, 3]
    for x in math_samples:  # one generation per group: all members share its turn record
        assert len(x.turn_keys) == 1 and x.turn_keys[0].endswith("turn-000")
    math_groups = {x.group_id for x in math_samples}
    group_generates = [k for kind, k in w.log if kind == "generate" and k.endswith("n=4")]
    assert len(group_generates) >= len(math_groups)  # one n=4 call per group, not one per member
    resets = [t for kind, t in w.log if kind == "reset"]
    assert not any(t.startswith(g) for g in math_groups for t in resets)  # no env session for single-turn
    assert any(kind == "reward_batch" for kind, _ in w.log)
    assert any(int(n) > 1 for kind, n in w.log if kind == "prompts")  # groups launched together share calls


async def test_multi_turn_groups_play_in_lockstep_with_one_call_per_turn(bare_env: WorkflowEnvironment) -> None:
    """rollout_unit group: one reset, one generate_batch and one step_group per turn for the whole group."""
    w = World(fail_seeds={2})  # the third group's env crashes: all its members fail, masked
    task = frozenlake_task(group_size=4, max_turns=3, rollout_unit="group")
    spec = JobSpec(name="wf", tasks=[task], training=TrainingConfig(steps=3, batch_size=8, async_bound=1))
    result, status = await train(bare_env, w, spec)
    assert result.version == 3 and status.ledger_balanced and result.failed >= 4
    assert_ledger(result)
    assert not any(kind in ("reset", "generate", "step") for kind, _ in w.log)  # no per-member activities
    assert len(w.trained_ids) == len(set(w.trained_ids))
    samples = [x for s in w.steps for x in s.samples]
    assert {len(x.turn_keys) for x in samples} == {1, 2, 3}  # member i plays min(i + 1, max_turns) turns
    for x in samples:
        member = int(x.trajectory_id.rsplit("-", 1)[1])
        assert len(x.turn_keys) == min(member + 1, 3)
        assert x.turn_keys[-1].endswith(f"turn-{len(x.turn_keys) - 1:03d}") and x.completion_index == 0
    played = [int(n) for kind, n in w.log if kind == "generate_batch"]
    assert played and set(played) <= {4, 3, 2}  # members still playing, turn by turn
    assert played.count(4) >= played.count(3) >= played.count(2) > 0


@pytest.mark.parametrize("mode", ["batch", "trajectory"])
async def test_grouped_batches_play_phase_by_phase_and_groups_otherwise_alone(bare_env: WorkflowEnvironment,
                                                                             mode: str) -> None:  # fmt: skip
    """Batch mode, rollout_unit group: every group's generations before any group's step (the baseline's barrier);
    trajectory mode: a group steps while another still waits for its answer."""
    task = frozenlake_task(group_size=4, max_turns=3, rollout_unit="group")
    spec = JobSpec(name="wf", tasks=[task], training=TrainingConfig(steps=2, batch_size=8, async_bound=0,
                                                                    rollout_mode=mode))  # fmt: skip
    # the first group is held; g000002's generation and g000003's env crash: both masked
    w = World(held_group="-g000000", broken_engine_group="-g000002", fail_seeds={3})
    result, status = await train(bare_env, w, spec)
    assert result.version == 2 and status.ledger_balanced and result.failed == 8
    assert_ledger(result)
    assert not any(kind == "step_group" and "-g000002/" in what for kind, what in w.log)  # a failed group stops
    assert not any(kind in ("reset", "generate", "step") for kind, _ in w.log)  # group activities only
    assert ("held", "timed out" if mode == "batch" else "released") in w.log
    if mode == "batch":
        kinds = [k for k, _ in w.log if k in ("reset_group", "generate_batch", "step_group", "reward_batch")]
        first_batch = kinds[: kinds.index("reward_batch") + 2]
        assert first_batch == ["reset_group"] * 2 + (["generate_batch"] * 2 + ["step_group"] * 2) * 3 + ["reward_batch"] * 2


async def test_trajectories_cancelled_at_the_end_count_as_cancelled_not_failed(bare_env: WorkflowEnvironment) -> None:
    """Slow turns and bound 2 leave trajectories in flight at the last step; their cancellation is no failure."""
    w = World(turn_delay_s=0.3)
    result, status = await train(bare_env, w, job(async_bound=2, steps=2))
    assert result.version == 2 and status.ledger_balanced
    assert result.cancelled_in_flight > 0 and result.failed == 0
    assert_ledger(result)
