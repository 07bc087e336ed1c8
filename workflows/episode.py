"""One episode's activity calls and bookkeeping, shared by the per-trajectory and the lockstep workflows.

`Episode` holds what an episode has seen so far (its env session, turns,
generations) and knows how to call each activity on the right queue with the
right policy. `TrajectoryWorkflow` drives one episode turn by turn;
`BatchRolloutWorkflow` drives many in lockstep. Same calls, same results.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

with workflow.unsafe.imports_passed_through():
    from rollart.contracts.activities import (
        ActivityName,
        CloseInput,
        EnvHandle,
        EnvOptions,
        GenerateInput,
        GenerateResult,
        GroupHandle,
        ResetInput,
        RestoreInput,
        RewardInput,
        RewardResult,
        StepInput,
        StepResult,
        Transcript,
        TurnRecord,
        WeightsRef,
        turn_key,
    )
    from rollart.infra.pools import Pool
    from rollart.workflows import policies
    from rollart.contracts.rollouts import TrajectoryInput, TrajectoryResult

__all__ = ["BAD_INPUT_TYPES", "Episode", "describe", "error_type", "reject_multi_sample", "restore", "session_lost"]

BAD_INPUT_TYPES = ("InvalidInput", "UnknownComponent")
"""Activity errors that mean the workflow's input is wrong: they fail the workflow, not just the episode."""


@dataclass
class Episode:
    """The state of one episode between activity calls."""

    inp: TrajectoryInput
    trajectory_id: str
    handle: EnvHandle | None = None
    observation: str = ""
    turns: list[TurnRecord] = field(default_factory=list)
    gens: list[GenerateResult] = field(default_factory=list)
    done: bool = False
    restores: int = 0

    @property
    def over(self) -> bool:
        """No more turns to play: the env said done, or max_turns is reached."""
        return self.done or len(self.turns) >= self.inp.task.max_turns

    async def reset(self) -> None:
        task = self.inp.task
        self.handle = await workflow.execute_activity(
            ActivityName.RESET.value,
            ResetInput(env=task.env, env_args=task.env_args, seed=self.inp.seed, trajectory_id=self.trajectory_id,
                       options=EnvOptions.of(task)),  # fmt: skip
            task_queue=Pool.CPU.value,
            result_type=EnvHandle,
            **policies.RESET.kwargs(),
        )
        self.observation = self.handle.observation

    async def generate(self) -> GenerateResult:
        task = self.inp.task
        data_key = turn_key(self.inp.job_id, self.trajectory_id, len(self.turns))
        weights = WeightsRef(job_id=self.inp.job_id, min_version=self.inp.min_version) if self.inp.job_id else None
        gen = await workflow.execute_activity(
            ActivityName.GENERATE.value,
            GenerateInput(prompt=self.observation, sampling=task.sampling, data_key=data_key, weights=weights),
            task_queue=task.generate_pool.value,
            result_type=GenerateResult,
            **policies.GENERATE.kwargs(),
        )
        return gen

    async def step(self, gen: GenerateResult) -> None:
        """Play the generation's text as this turn's action (on the worker holding the session).

        If that worker is gone, the session is restored on another one (same seed, recorded actions
        replayed, last observation checked) and the step is played there: sticky-session failover.
        """
        assert self.handle is not None
        while True:
            try:
                step = await workflow.execute_activity(
                    ActivityName.STEP.value,
                    StepInput(session_id=self.handle.session_id, action=gen.completions[0].text),
                    task_queue=self.handle.queue,
                    result_type=StepResult,
                    **policies.STEP.kwargs(timeout_s=self.handle.step_timeout_s),
                )
                break
            except ActivityError as err:
                if not session_lost(err) or self.restores >= policies.MAX_RESTORES:
                    raise
                workflow.logger.warning("trajectory %s: %s; restoring its env elsewhere", self.trajectory_id,
                                        describe(err))  # fmt: skip
                self.restores += 1
                handle = await restore(self.inp, self.trajectory_id, [self])
                self.handle = EnvHandle(session_id=handle.session_id, queue=handle.queue, worker_id=handle.worker_id,
                                        observation=self.observation, step_timeout_s=handle.step_timeout_s)  # fmt: skip
        self.record(gen, step)

    def transcript(self) -> Transcript:
        """The episode as a reward function sees it."""
        return Transcript(task=self.inp.task.name, seed=self.inp.seed, turns=self.turns,
                          final_observation=self.observation)  # fmt: skip

    def record(self, gen: GenerateResult, step: StepResult) -> None:
        """Book one played turn: the action the model chose and what the env answered."""
        self.gens.append(gen)
        self.turns.append(TurnRecord(observation=self.observation, action=gen.completions[0].text,
                                     env_reward=step.reward, done=step.done, info=step.info))  # fmt: skip
        self.observation = step.observation
        self.done = step.done

    async def score(self) -> RewardResult:
        return await workflow.execute_activity(
            ActivityName.REWARD.value,
            RewardInput(reward=self.inp.task.reward, transcript=self.transcript(), reward_args=self.inp.task.reward_args),
            task_queue=self.inp.task.reward_queue,  # "serverless", or the generation pool when colocated
            result_type=RewardResult,
            **policies.REWARD.kwargs(),
        )

    async def close(self) -> None:
        """Release the env session; failure here only logs (the session dies with its worker anyway)."""
        if self.handle is None:
            return
        try:
            await workflow.execute_activity(
                ActivityName.CLOSE.value,
                CloseInput(session_id=self.handle.session_id),
                task_queue=self.handle.queue,
                **policies.CLOSE.kwargs(),
            )
        except ActivityError as err:
            workflow.logger.warning("closing session %s failed: %s", self.handle.session_id, describe(err))

    def result(self, **outcome: Any) -> TrajectoryResult:
        """The compact result; `outcome` gives status and reward/success or error."""
        versions = [v for g in self.gens for v in (g.policy_version, g.policy_version_end)]
        return TrajectoryResult(
            trajectory_id=self.trajectory_id,
            task=self.inp.task.name,
            seed=self.inp.seed,
            group_id=self.inp.group_id,
            turns=len(self.turns),
            policy_version_min=min(versions) if versions else None,
            policy_version_max=max(versions) if versions else None,
            prompt_tokens=sum(g.prompt_tokens for g in self.gens),
            completion_tokens=sum(c.num_tokens for g in self.gens for c in g.completions),
            turn_keys=[g.data_key for g in self.gens],
            env_worker=self.handle.worker_id if self.handle else None,
            restores=self.restores,
            **outcome,
        )


def reject_multi_sample(inp: TrajectoryInput) -> None:
    """Multi-turn episodes sample one completion per turn; GRPO groups are separate episodes."""
    if inp.task.sampling.n != 1:
        raise ApplicationError(
            f"task {inp.task.name!r}: a multi-turn trajectory samples one completion per turn (sampling.n = 1); "
            "use group_size for GRPO groups",
            type="InvalidInput",
            non_retryable=True,
        )


def session_lost(err: ActivityError) -> bool:
    """Whether a sticky call failed because the env worker holding the session is gone (not the env itself).

    SessionLost: the worker answered but has no such session (restarted). A timeout: the worker never
    picked the call up (schedule-to-start on its private queue) or died while running it.
    """
    return error_type(err) == "SessionLost" or isinstance(err.cause, TemporalTimeoutError)


async def restore(inp: TrajectoryInput, owner_id: str, members: list[Episode]) -> GroupHandle:
    """Rebuild the session of `members` (one trajectory, or a lockstep group) on a live env worker."""
    task = inp.task
    return await workflow.execute_activity(
        ActivityName.RESTORE.value,
        RestoreInput(env=task.env, env_args=task.env_args, seed=inp.seed, owner_id=owner_id,
                     actions=[[t.action for t in ep.turns] for ep in members],
                     observations=[ep.observation for ep in members], options=EnvOptions.of(task)),  # fmt: skip
        task_queue=Pool.CPU.value,
        result_type=GroupHandle,
        **policies.RESTORE.kwargs(),
    )


def error_type(err: ActivityError) -> str | None:
    """The ApplicationError type behind an activity failure, if any."""
    cause = err.cause
    return cause.type if isinstance(cause, ApplicationError) else None


def describe(err: ActivityError) -> str:
    """`step failed: EnvBroken: the env raised ...` — which activity, and why."""
    cause = err.cause
    if isinstance(cause, ApplicationError):
        why = f"{cause.type}: {cause.message}" if cause.type else cause.message
    elif isinstance(cause, TemporalTimeoutError):
        why = f"timed out ({cause.type.name if cause.type else 'timeout'})"
    else:
        why = str(cause or err)
    return f"{err.activity_type} failed: {why}"
