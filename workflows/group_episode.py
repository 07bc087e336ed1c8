"""One multi-turn GRPO group played in lockstep: a session of `group_size` envs, a batched turn at a time.

Each member is an `Episode` (its turns, generations, observation); the group
holds one env session for all of them and calls `generate_batch` and
`step_group` once per turn for the members still playing. Same results as the
members' own TrajectoryWorkflows would report, in ~8x fewer activities.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from rollart.contracts.activities import (
        ActivityName,
        EnvHandle,
        EnvOptions,
        GenerateBatchInput,
        GenerateResult,
        GroupHandle,
        GroupResetInput,
        GroupStepInput,
        RewardBatchInput,
        RewardResult,
        StepResult,
        WeightsRef,
        turn_key,
    )
    from rollart.infra.pools import Pool
    from rollart.workflows import policies
    from rollart.workflows.episode import BAD_INPUT_TYPES, Episode, describe, error_type, restore, session_lost
    from rollart.workflows.trajectory import report
    from rollart.contracts.rollouts import GroupRolloutInput, GroupSeed, TrajectoryInput, TrajectoryResult

__all__ = ["GroupEpisode", "play_in_lockstep"]

T = TypeVar("T")


class GroupEpisode:
    """The members of one group and the one env session they share."""

    def __init__(self, inp: GroupRolloutInput, group: GroupSeed) -> None:
        self.inp = inp
        self.group = group
        self.handle: GroupHandle | None = None
        self.error: str | None = None  # why the group failed, once it has
        self._generated: dict[str, GenerateResult] = {}  # this turn's generations, by member
        member = TrajectoryInput(task=inp.task, seed=group.seed, job_id=inp.job_id, group_id=group.group_id,
                                 min_version=inp.min_version)  # fmt: skip
        self.members = [Episode(inp=member, trajectory_id=f"{group.group_id}-{m}") for m in range(inp.task.group_size)]

    async def play(self) -> list[TrajectoryResult]:
        """reset_group → (generate_batch → step_group)* → reward_batch → close; reports the group when done.

        Any activity that still fails after its retries fails the whole group (masked from
        training, never scored); bad input fails the workflow.
        """
        return await play_in_lockstep([self])

    @property
    def playing(self) -> bool:
        """Members still to play a turn, and no failure so far."""
        return self.error is None and any(not ep.over for ep in self.members)

    async def start(self) -> None:
        """The group's env session (`reset_group`): the first phase of `play_in_lockstep`."""
        await self._guard(self._reset)

    async def generate(self) -> None:
        """One `generate_batch` for the members still playing (kept for `step`)."""
        await self._guard(self._generate)

    async def step(self) -> None:
        """One `step_group` with the generated actions; each member records its turn."""
        await self._guard(self._step)

    async def finish(self) -> list[TrajectoryResult]:
        """Score (unless failed), close the session, report the group's results and return them."""
        try:
            scores = await self._guard(self._score)
        finally:
            await self.close()
        if scores is None:
            results = [ep.result(status="failed", error=self.error) for ep in self.members]
        else:
            results = [ep.result(status="completed", reward=s.value, success=s.success)
                       for ep, s in zip(self.members, scores)]  # fmt: skip
        await report(self.inp.report_to, results)
        return results

    async def _guard(self, phase: Callable[[], Awaitable[T]]) -> T | None:
        """Run a phase unless the group has failed; an activity that failed after its retries fails the group
        (later phases are skipped), bad input fails the workflow."""
        if self.error is not None:
            return None
        try:
            return await phase()
        except ActivityError as err:
            if error_type(err) in BAD_INPUT_TYPES:
                raise ApplicationError(describe(err), type=error_type(err), non_retryable=True) from err
            workflow.logger.warning("group %s failed: %s", self.group.group_id, describe(err))
            self.error = describe(err)
            return None

    async def _reset(self) -> None:
        task = self.inp.task
        self.handle = await workflow.execute_activity(
            ActivityName.RESET_GROUP.value,
            GroupResetInput(env=task.env, env_args=task.env_args, seed=self.group.seed, size=task.group_size,
                            group_id=self.group.group_id, options=EnvOptions.of(task)),  # fmt: skip
            task_queue=Pool.CPU.value,
            result_type=GroupHandle,
            **policies.RESET.kwargs(),
        )
        for ep, observation in zip(self.members, self.handle.observations):
            ep.observation = observation
        self._share_handle()

    def _share_handle(self) -> None:
        """Members share the session: each names it for its result."""
        assert self.handle is not None
        for ep in self.members:
            ep.handle = EnvHandle(session_id=self.handle.session_id, queue=self.handle.queue,
                                  worker_id=self.handle.worker_id, observation=ep.observation)  # fmt: skip

    async def _generate(self) -> None:
        task, inp = self.inp.task, self.inp
        playing = [ep for ep in self.members if not ep.over]
        weights = WeightsRef(job_id=inp.job_id, min_version=inp.min_version) if inp.job_id else None
        gens: list[GenerateResult] = await workflow.execute_activity(
            ActivityName.GENERATE_BATCH.value,
            GenerateBatchInput(prompts=[ep.observation for ep in playing], sampling=task.sampling, weights=weights,
                               data_keys=[turn_key(inp.job_id, ep.trajectory_id, len(ep.turns)) for ep in playing]),
            task_queue=task.generate_pool.value,
            result_type=list[GenerateResult],
            **policies.GENERATE.kwargs(),
        )  # fmt: skip
        self._generated = dict(zip((ep.trajectory_id for ep in playing), gens))

    async def _step(self) -> None:
        by_member, self._generated = self._generated, {}
        actions = [by_member[ep.trajectory_id].completions[0].text if ep.trajectory_id in by_member else None
                   for ep in self.members]  # fmt: skip
        steps = await self._step_group(actions, len(by_member))
        for ep, step in zip(self.members, steps):
            if ep.trajectory_id in by_member and step is not None:
                ep.record(by_member[ep.trajectory_id], step)

    async def _step_group(self, actions: list[str | None], playing: int) -> list[StepResult | None]:
        """One step_group; if the group's env worker is gone, restore all members elsewhere and play it there."""
        restores = 0
        while True:
            assert self.handle is not None
            try:
                return await workflow.execute_activity(
                    ActivityName.STEP_GROUP.value,
                    GroupStepInput(session_id=self.handle.session_id, actions=actions),
                    task_queue=self.handle.queue,
                    result_type=list[StepResult | None],
                    **policies.STEP.kwargs(timeout_s=self.handle.step_timeout_s * playing),
                )
            except ActivityError as err:
                if not session_lost(err) or restores >= policies.MAX_RESTORES:
                    raise
                workflow.logger.warning("group %s: %s; restoring its envs elsewhere", self.group.group_id,
                                        describe(err))  # fmt: skip
                restores += 1
                for ep in self.members:
                    ep.restores += 1
                self.handle = await restore(self.members[0].inp, self.group.group_id, self.members)
                self._share_handle()

    async def _score(self) -> list[RewardResult]:
        return await workflow.execute_activity(
            ActivityName.REWARD_BATCH.value,
            RewardBatchInput(reward=self.inp.task.reward, transcripts=[ep.transcript() for ep in self.members],
                             reward_args=self.inp.task.reward_args),  # fmt: skip
            task_queue=self.inp.task.reward_queue,  # "serverless", or the generation pool when colocated
            result_type=list[RewardResult],
            **policies.REWARD.kwargs(),
        )

    async def close(self) -> None:
        """Release the shared session (through any member: they all name it)."""
        await self.members[0].close()


async def play_in_lockstep(groups: list[GroupEpisode]) -> list[TrajectoryResult]:
    """Every group's phase before any group's next (one group: its own play); each group reports when scored.

    With several groups this is the synchronous baseline's barrier at group granularity: the batch
    waits for its slowest reset, answer and step.
    """
    try:
        await asyncio.gather(*(g.start() for g in groups))
        while live := [g for g in groups if g.playing]:
            await asyncio.gather(*(g.generate() for g in live))
            await asyncio.gather(*(g.step() for g in live))
    except BaseException:
        await asyncio.gather(*(g.close() for g in groups))
        raise
    per_group = await asyncio.gather(*(g.finish() for g in groups))
    return [r for results in per_group for r in results]
