"""Single-turn GRPO groups: an episode needs no env session, so a wave of groups takes a few calls.

One `prompts` for every group's seed, one `generate_batch` per live engine of the pool for its share of the
groups' prompts with n = group size (each engine batches its share and shares each prompt's prefix), then
one `check` and one `reward_batch` for every answer. Which engines are alive comes from one `live_engines`
call on the control queue (worker heartbeats, see `activities/queues.py`); with affinity off, one engine or
none known, or a wave of one group, the wave goes whole to the shared queue and there is no such call. A
group whose generation fails ends `failed` on its own; the others are checked and scored: when a share's
`generate_batch` raises (rather than timing out or being cancelled), each of its groups is generated on its
own so that the failure lands on the groups it concerns.
"""

from __future__ import annotations

import asyncio

from rollart.contracts.activities import (
    ActivityName,
    CheckInput,
    PromptsInput,
    RewardBatchInput,
    RewardResult,
    StepResult,
    Transcript,
    TurnRecord,
    turn_key,
)
from rollart.contracts.generation import (
    GenerateBatchInput,
    GenerateInput,
    GenerateResult,
    LiveEnginesInput,
    LiveEnginesResult,
    WeightsRef,
)
from rollart.contracts.rollouts import GroupRolloutInput, GroupSeed, TrajectoryResult
from rollart.spec.config import SamplingParams
from rollart.spec.pools import Pool, queue_name
from rollart.workflows.driver.affinity import Pin, generate_on, split_wave
from rollart.workflows.driver.calls import CallFailed, Calls
from rollart.workflows.driver.priority import request_priority

__all__ = ["play_single_turn"]


async def play_single_turn(calls: Calls, inp: GroupRolloutInput) -> list[TrajectoryResult]:
    """prompts → generate_batch (n = group size) → check → reward_batch; failures masked, never scored."""
    try:
        prompts = await _prompts(calls, inp)
    except CallFailed as err:
        return _all_failed(calls, inp, inp.groups, err)
    gens = await _generate_wave(calls, inp, prompts)
    ok = [(g, p, gen) for g, p, gen in zip(inp.groups, prompts, gens) if isinstance(gen, GenerateResult)]
    by_group = {
        g.group_id: _failed(inp, g, gen.message, gen.job_fault)
        for g, gen in zip(inp.groups, gens)
        if isinstance(gen, CallFailed)
    }
    if ok:
        try:
            scored = await _check_and_score(calls, inp, ok)
        except CallFailed as err:
            scored = _all_failed(calls, inp, [g for g, _, _ in ok], err)
        for r in scored:
            by_group.setdefault(r.group_id, []).append(r)
    return [r for g in inp.groups for r in by_group[g.group_id]]


def _all_failed(
    calls: Calls, inp: GroupRolloutInput, groups: list[GroupSeed], err: CallFailed
) -> list[TrajectoryResult]:
    """A call every group in `groups` needed failed for good: they all end failed (a bad input fails the run)."""
    error = err.mask(calls, "single-turn groups " + ", ".join(g.group_id for g in groups))
    return [r for g in groups for r in _failed(inp, g, error, err.job_fault)]


async def _prompts(calls: Calls, inp: GroupRolloutInput) -> list[str]:
    task = inp.task
    return await calls.call(
        ActivityName.PROMPTS,
        PromptsInput(env=task.env, env_args=task.env_args, seeds=[g.seed for g in inp.groups]),
        queue=queue_name(task.env_queue, inp.queue_prefix),
        result_type=list[str],
    )


async def _generate_wave(calls: Calls, inp: GroupRolloutInput, prompts: list[str]) -> list[GenerateResult | CallFailed]:
    """Every group's generation: a share of the wave per live engine (`split_wave`), the shares at once."""
    engines = await _live_engines(calls, inp)
    shares = split_wave(len(inp.groups), engines, offset=inp.groups[0].seed)
    outcomes = await asyncio.gather(*(_generate_share(calls, inp, prompts, list(idx), queue) for queue, idx in shares))
    return [gen for share in outcomes for gen in share]


async def _live_engines(calls: Calls, inp: GroupRolloutInput) -> list[str]:
    """The private queues of the pool's live engines, when the wave could split (else, or if unknown: none)."""
    if not inp.affinity.sticky or len(inp.groups) <= 1:
        return []
    try:
        live: LiveEnginesResult = await calls.call(
            ActivityName.LIVE_ENGINES,
            LiveEnginesInput(pool=inp.task.generate_pool, queue_prefix=inp.queue_prefix),
            queue=queue_name(Pool.CONTROL, inp.queue_prefix),
            result_type=LiveEnginesResult,
        )
    except CallFailed as err:  # not knowing costs only the split
        calls.logger.info("live engines of %s unknown (%s): the wave goes whole", inp.task.generate_pool, err.message)
        return []
    return live.queues


async def _generate_share(
    calls: Calls, inp: GroupRolloutInput, prompts: list[str], idx: list[int], engine: str | None
) -> list[GenerateResult | CallFailed]:
    """The groups `idx` in one `generate_batch` on `engine` (else the shared queue); if the engine raised, per group.

    An error the activity raised may be one group's (a prompt the engine rejects): generating each group on
    its own then fails only the groups it concerns. A timeout concerns the engine, which every group's call
    would wait on again, and a cancellation the whole wave: all of its groups end failed. A bad input raises.
    """
    groups = [inp.groups[i] for i in idx]
    try:
        return list(await _generate_batch(calls, inp, groups, [prompts[i] for i in idx], engine))
    except CallFailed as err:
        if err.error_type is not None and not err.bad_input:  # raised by the activity: maybe one request's
            calls.logger.info(
                "wave generate_batch failed (%s): generating its %d groups one by one", err.message, len(groups)
            )
            return await _generate_each(calls, inp, groups, [prompts[i] for i in idx])
        err.mask(calls, "single-turn groups " + ", ".join(g.group_id for g in groups))
        return [err] * len(groups)


async def _generate_batch(
    calls: Calls, inp: GroupRolloutInput, groups: list[GroupSeed], prompts: list[str], engine: str | None
) -> list[GenerateResult]:
    """One call for a share of the wave: prompt i with n = group size, its tokens under group i's turn key; on
    `engine`'s private queue if given (the shared queue if it fails there for the engine's sake)."""
    return await generate_on(
        calls,
        inp.affinity,
        Pin(queue=engine or ""),
        ActivityName.GENERATE_BATCH,
        GenerateBatchInput(
            prompts=prompts,
            sampling=_sampling(inp),
            weights=_weights(inp),
            prompt_format=inp.task.prompt,
            data_keys=[turn_key(inp.job_id, g.group_id, 0) for g in groups],
            priority=request_priority(inp.priority, 0, inp.predicted_turns),
        ),
        shared=queue_name(inp.task.generate_pool, inp.queue_prefix),
        result_type=list[GenerateResult],
    )


async def _generate_each(
    calls: Calls, inp: GroupRolloutInput, groups: list[GroupSeed], prompts: list[str]
) -> list[GenerateResult | CallFailed]:
    """Each group's generation at once, each its own `generate` on the shared queue: a failure stays its group's."""
    work = [_generate(calls, inp, g, p) for g, p in zip(groups, prompts)]
    outcomes = await asyncio.gather(*work, return_exceptions=True)
    for group, out in zip(groups, outcomes):
        if isinstance(out, CallFailed):
            out.mask(calls, f"single-turn group {group.group_id}")
        elif isinstance(out, BaseException):
            raise out
    return list(outcomes)  # type: ignore[arg-type]


async def _generate(calls: Calls, inp: GroupRolloutInput, group: GroupSeed, prompt: str) -> GenerateResult:
    return await calls.call(
        ActivityName.GENERATE,
        GenerateInput(
            prompt=prompt,
            sampling=_sampling(inp),
            data_key=turn_key(inp.job_id, group.group_id, 0),
            weights=_weights(inp),
            prompt_format=inp.task.prompt,
        ),
        queue=queue_name(inp.task.generate_pool, inp.queue_prefix),
        result_type=GenerateResult,
        heartbeat_s=inp.affinity.heartbeat_s,
    )


def _sampling(inp: GroupRolloutInput) -> SamplingParams:
    """A group's samples come from one request: n = group size."""
    return inp.task.sampling.model_copy(update={"n": inp.task.group_size})


def _weights(inp: GroupRolloutInput) -> WeightsRef | None:
    """The policy the wave needs at least (the step it was launched at); None outside a job."""
    return WeightsRef(job_id=inp.job_id, min_version=inp.min_version) if inp.job_id else None


async def _check_and_score(
    calls: Calls, inp: GroupRolloutInput, ok: list[tuple[GroupSeed, str, GenerateResult]]
) -> list[TrajectoryResult]:
    task = inp.task
    seeds = [g.seed for g, _, _ in ok]
    answers = [[c.text for c in gen.completions] for _, _, gen in ok]
    steps: list[list[StepResult]] = await calls.call(
        ActivityName.CHECK,
        CheckInput(env=task.env, env_args=task.env_args, seeds=seeds, answers=answers),
        queue=queue_name(task.env_queue, inp.queue_prefix),
        result_type=list[list[StepResult]],
    )
    transcripts = [
        Transcript(
            task=task.name,
            seed=g.seed,
            final_observation=s.observation,
            turns=[TurnRecord(observation=prompt, action=text, env_reward=s.reward, done=s.done, info=s.info)],
        )
        for (g, prompt, _), texts, row in zip(ok, answers, steps)
        for text, s in zip(texts, row)
    ]
    scores: list[RewardResult] = await calls.call(
        ActivityName.REWARD_BATCH,
        RewardBatchInput(reward=task.reward, transcripts=transcripts, reward_args=task.reward_args),
        queue=queue_name(task.reward_queue, inp.queue_prefix),
        result_type=list[RewardResult],
    )
    return _completed(inp, [(g, gen) for g, _, gen in ok], scores)


def _completed(
    inp: GroupRolloutInput, groups: list[tuple[GroupSeed, GenerateResult]], scores: list[RewardResult]
) -> list[TrajectoryResult]:
    results, k = [], 0
    for group, gen in groups:
        for m, (tid, c) in enumerate(zip(group.members(inp.task.group_size), gen.completions)):
            results.append(
                TrajectoryResult(
                    trajectory_id=tid,
                    task=inp.task.name,
                    seed=group.seed,
                    group_id=group.group_id,
                    status="completed",
                    reward=scores[k].value,
                    success=scores[k].success,
                    turns=1,
                    policy_version_min=gen.policy_version,
                    policy_version_max=gen.policy_version_end,
                    prompt_tokens=gen.prompt_tokens,
                    completion_tokens=c.num_tokens,
                    uncached_prompt_tokens=gen.prompt_tokens if m == 0 else 0,  # the group's samples share one prompt
                    turn_keys=[gen.data_key],
                    completion_index=m,
                    engine_worker=gen.worker_id or None,
                    engine_pool=inp.task.generate_pool,
                    pressure=gen.pressure,
                )
            )
            k += 1
    return results


def _failed(
    inp: GroupRolloutInput, group: GroupSeed, error: str, error_type: str | None = None
) -> list[TrajectoryResult]:
    return [
        TrajectoryResult(
            trajectory_id=tid,
            task=inp.task.name,
            seed=group.seed,
            group_id=group.group_id,
            status="failed",
            error=error,
            error_type=error_type,
        )
        for tid in group.members(inp.task.group_size)
    ]
