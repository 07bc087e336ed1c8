"""One multi-turn GRPO group played in lockstep: a session of `group_size` envs, a batched turn at a time.

Each member is an `Episode` (its turns, generations, observation); the group holds one env session for
all of them and calls `generate_batch` and `step_group` once per turn for the members still playing.
Same results as the members' own trajectories would report, in ~8x fewer activities.
"""

from __future__ import annotations

from rollart.contracts.activities import (
    ActivityName,
    EnvHandle,
    EnvOptions,
    GroupHandle,
    GroupResetInput,
    GroupStepInput,
    RewardBatchInput,
    RewardResult,
    StepResult,
    turn_key,
)
from rollart.contracts.generation import GenerateBatchInput, GenerateResult, WeightsRef
from rollart.contracts.rollouts import GroupRolloutInput, GroupSeed, TrajectoryInput, TrajectoryResult
from rollart.spec.pools import queue_name
from rollart.workflows.driver.affinity import Pin, generate_on
from rollart.workflows.driver.calls import Calls
from rollart.workflows.driver.episode import Episode
from rollart.workflows.driver.priority import request_priority
from rollart.workflows.driver.session import call_sticky

__all__ = ["GroupEpisode"]


class GroupEpisode:
    """The members of one group and the one env session they share; a unit of `lockstep.play`."""

    def __init__(self, calls: Calls, inp: GroupRolloutInput, group: GroupSeed) -> None:
        self.calls = calls
        self.group = group
        self.handle: GroupHandle | None = None
        self.error: str | None = None  # why the group failed, once it has
        self.error_type: str | None = None  # the job's own fault, when it is one (CallFailed.job_fault)
        self._generated: dict[str, GenerateResult] = {}  # this turn's generations, by member
        self.inp = TrajectoryInput(
            task=inp.task,
            seed=group.seed,
            job_id=inp.job_id,
            group_id=group.group_id,
            min_version=inp.min_version,
            queue_prefix=inp.queue_prefix,
            affinity=inp.affinity,
            priority=inp.priority,
            predicted_turns=inp.predicted_turns,
        )
        self.pin = Pin()  # one engine serves every member's turn (one generate_batch): they share its pin
        self.members = [Episode(calls, self.inp, tid, pin=self.pin) for tid in group.members(inp.task.group_size)]

    @property
    def owner_id(self) -> str:
        return self.group.group_id

    def predicted_turns(self) -> float | None:
        """The group's predicted length: its longest finished member's turns, else the task's mean."""
        finished = [len(ep.turns) for ep in self.members if ep.over]
        return max(finished) if finished else self.inp.predicted_turns

    @property
    def playing(self) -> bool:
        """Members still to play a turn, and no failure so far."""
        return self.error is None and any(not ep.over for ep in self.members)

    def queue(self, pool: object) -> str:
        return queue_name(str(pool), self.inp.queue_prefix)

    async def start(self) -> None:
        """One env session holding every member, reset from the group's seed (`reset_group`)."""
        task = self.inp.task
        handle = await self.calls.call(
            ActivityName.RESET_GROUP,
            GroupResetInput(
                env=task.env,
                env_args=task.env_args,
                seed=self.group.seed,
                size=task.group_size,
                group_id=self.group.group_id,
                options=EnvOptions.of(task),
            ),
            queue=self.queue(task.env_queue),
            result_type=GroupHandle,
        )
        for ep, observation in zip(self.members, handle.observations):
            ep.observation = observation
        self.rehome(handle)

    def rehome(self, handle: GroupHandle) -> None:
        """The session is (now) on `handle`'s worker: each member names it for its result."""
        self.handle = handle
        for ep in self.members:
            ep.handle = EnvHandle(
                session_id=handle.session_id,
                queue=handle.queue,
                worker_id=handle.worker_id,
                observation=ep.observation,
                sticky_start_s=handle.sticky_start_s,
            )

    async def generate(self) -> None:
        """One `generate_batch` for the members still playing (kept for `step`), on the engine of the group's
        previous turn when it can (workflows/driver/affinity.py)."""
        task, inp = self.inp.task, self.inp
        playing = [ep for ep in self.members if not ep.over]
        weights = WeightsRef(job_id=inp.job_id, min_version=inp.min_version) if inp.job_id else None
        gens: list[GenerateResult] = await generate_on(
            self.calls,
            inp.affinity,
            self.pin,
            ActivityName.GENERATE_BATCH,
            GenerateBatchInput(
                prompts=[ep.observation for ep in playing],
                sampling=task.sampling,
                weights=weights,
                prompt_format=task.prompt,
                data_keys=[turn_key(inp.job_id, ep.trajectory_id, len(ep.turns)) for ep in playing],
                priority=request_priority(inp.priority, max(len(ep.turns) for ep in playing), self.predicted_turns()),
            ),
            shared=self.queue(task.generate_pool),
            result_type=list[GenerateResult],
        )
        self._generated = dict(zip((ep.trajectory_id for ep in playing), gens))

    async def step(self) -> None:
        """One `step_group` with the generated actions (None: a member whose episode is over); each records its turn."""
        by_member, self._generated = self._generated, {}
        actions = [
            by_member[ep.trajectory_id].completions[0].text if ep.trajectory_id in by_member else None
            for ep in self.members
        ]
        assert self.handle is not None
        steps: list[StepResult | None] = await call_sticky(
            self.calls,
            self,
            ActivityName.STEP_GROUP,
            lambda h: GroupStepInput(session_id=h.session_id, actions=actions),
            result_type=list[StepResult | None],
            timeout_s=self.handle.step_timeout_s * len(by_member),
        )
        for ep, step in zip(self.members, steps):
            if ep.trajectory_id in by_member and step is not None:
                ep.record(by_member[ep.trajectory_id], step)

    async def score(self) -> list[RewardResult]:
        """Score every member in one `reward_batch`."""
        task = self.inp.task
        return await self.calls.call(
            ActivityName.REWARD_BATCH,
            RewardBatchInput(
                reward=task.reward, transcripts=[ep.transcript() for ep in self.members], reward_args=task.reward_args
            ),
            queue=self.queue(task.reward_queue),
            result_type=list[RewardResult],
        )

    async def close(self) -> None:
        """Release the shared session (through any member: they all name it)."""
        await self.members[0].close()

    def results(self, scores: list[RewardResult] | None) -> list[TrajectoryResult]:
        """Every member's result: completed with its score, or all failed with the group's error."""
        if scores is None:
            return [ep.result(status="failed", error=self.error, error_type=self.error_type) for ep in self.members]
        return [ep.result(status="completed", reward=s.value, success=s.success) for ep, s in zip(self.members, scores)]
