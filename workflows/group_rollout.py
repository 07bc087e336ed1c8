"""GroupRolloutWorkflow: whole GRPO groups, a few activities for many samples.

Single-turn: an episode needs no env session. Prompts for all seeds come from
one `prompts` call, each group is one `generate` call with n = group size (the
engine shares the prompt's prefix), and the answers are checked and scored in
one `check` and one `reward_batch` call.

Multi-turn (`rollout_unit: group`): each group plays in lockstep inside one
env session holding all its members (`reset_group`), one `generate_batch` and
one `step_group` per turn for the members still playing, then one
`reward_batch`. Groups advance independently of each other and each reports as
soon as it is done — or, with `lockstep` (batch mode), all groups advance
phase by phase together, the synchronous baseline's barrier. Per trajectory
that is ~2.4 activities instead of ~19 for 8-turn episodes in groups of 8: the
unit to pick when Temporal's per-activity cost, not the env, dominates a turn. A slow member holds its group back, so
long-tail envs are better served by `rollout_unit: trajectory`.
"""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError
    from rollart.contracts.activities import (
        ActivityName,
        CheckInput,
        GenerateInput,
        GenerateResult,
        PromptsInput,
        RewardBatchInput,
        RewardResult,
        StepResult,
        Transcript,
        TurnRecord,
        WeightsRef,
        turn_key,
    )
    from rollart.infra.pools import Pool
    from rollart.workflows import policies
    from rollart.workflows.episode import BAD_INPUT_TYPES, describe, error_type
    from rollart.workflows.trajectory import report
    from rollart.workflows.group_episode import GroupEpisode, play_in_lockstep
    from rollart.contracts.rollouts import GroupRolloutInput, GroupSeed, TrajectoryResult

__all__ = ["GroupRolloutInput", "GroupRolloutWorkflow", "GroupSeed"]


@workflow.defn(name="GroupRolloutWorkflow", failure_exception_types=[ValidationError])
class GroupRolloutWorkflow:
    """Single-turn: prompts → generate (n = group size) → check → reward_batch; multi-turn: see `GroupEpisode`."""

    async def _multi_turn(self, inp: GroupRolloutInput) -> list[TrajectoryResult]:
        if inp.task.sampling.n != 1:
            raise ApplicationError(f"task {inp.task.name!r}: a multi-turn group samples one completion per member "
                                   "and turn (sampling.n = 1)", type="InvalidInput", non_retryable=True)  # fmt: skip
        if inp.lockstep:
            return await play_in_lockstep([GroupEpisode(inp, g) for g in inp.groups])
        per_group = await asyncio.gather(*(GroupEpisode(inp, g).play() for g in inp.groups))
        return [r for results in per_group for r in results]

    @workflow.run
    async def run(self, inp: GroupRolloutInput) -> list[TrajectoryResult]:
        if inp.task.max_turns > 1:
            return await self._multi_turn(inp)
        return await self._single_turn(inp)

    async def _single_turn(self, inp: GroupRolloutInput) -> list[TrajectoryResult]:
        task = inp.task
        seeds = [g.seed for g in inp.groups]
        gens: list[GenerateResult] = []
        try:
            prompts: list[str] = await workflow.execute_activity(
                ActivityName.PROMPTS.value, PromptsInput(env=task.env, env_args=task.env_args, seeds=seeds),
                task_queue=Pool.CPU.value, result_type=list[str], **policies.RESET.kwargs(),
            )  # fmt: skip
            gens = list(await asyncio.gather(*(self._generate(inp, g, p) for g, p in zip(inp.groups, prompts))))
            answers = [[c.text for c in gen.completions] for gen in gens]
            steps: list[list[StepResult]] = await workflow.execute_activity(
                ActivityName.CHECK.value, CheckInput(env=task.env, env_args=task.env_args, seeds=seeds, answers=answers),
                task_queue=Pool.CPU.value, result_type=list[list[StepResult]], **policies.CHECK.kwargs(),
            )  # fmt: skip
            transcripts = [
                Transcript(task=task.name, seed=seed, final_observation=s.observation,
                           turns=[TurnRecord(observation=prompt, action=text, env_reward=s.reward, done=s.done, info=s.info)])
                for seed, prompt, texts, row in zip(seeds, prompts, answers, steps) for text, s in zip(texts, row)
            ]  # fmt: skip
            scores: list[RewardResult] = await workflow.execute_activity(
                ActivityName.REWARD_BATCH.value,
                RewardBatchInput(reward=task.reward, transcripts=transcripts, reward_args=task.reward_args),
                task_queue=task.reward_queue, result_type=list[RewardResult], **policies.REWARD.kwargs(),
            )  # fmt: skip
            results = self._results(inp, gens, scores)
        except ActivityError as err:
            if error_type(err) in BAD_INPUT_TYPES:
                raise ApplicationError(describe(err), type=error_type(err), non_retryable=True) from err
            results = [
                TrajectoryResult(trajectory_id=f"{g.group_id}-{m}", task=task.name, seed=g.seed, group_id=g.group_id,
                                 status="failed", error=describe(err))
                for g in inp.groups for m in range(task.group_size)
            ]  # fmt: skip
        await report(inp.report_to, results)
        return results

    async def _generate(self, inp: GroupRolloutInput, group: GroupSeed, prompt: str) -> GenerateResult:
        weights = WeightsRef(job_id=inp.job_id, min_version=inp.min_version) if inp.job_id else None
        sampling = inp.task.sampling.model_copy(update={"n": inp.task.group_size})
        return await workflow.execute_activity(
            ActivityName.GENERATE.value,
            GenerateInput(prompt=prompt, sampling=sampling, data_key=turn_key(inp.job_id, group.group_id, 0),
                          weights=weights),  # fmt: skip
            task_queue=inp.task.generate_pool.value, result_type=GenerateResult, **policies.GENERATE.kwargs(),
        )  # fmt: skip

    def _results(self, inp: GroupRolloutInput, gens: list[GenerateResult], scores: list[RewardResult]) -> list[TrajectoryResult]:
        results, k = [], 0
        for group, gen in zip(inp.groups, gens):
            for m, c in enumerate(gen.completions):
                results.append(TrajectoryResult(
                    trajectory_id=f"{group.group_id}-{m}", task=inp.task.name, seed=group.seed, group_id=group.group_id,
                    status="completed", reward=scores[k].value, success=scores[k].success, turns=1,
                    policy_version_min=gen.policy_version, policy_version_max=gen.policy_version_end,
                    prompt_tokens=gen.prompt_tokens, completion_tokens=c.num_tokens, turn_keys=[gen.data_key],
                    completion_index=m,
                ))  # fmt: skip
                k += 1
        return results
