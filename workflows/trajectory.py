"""TrajectoryWorkflow: one agentic episode, reset → (generate → step)* → reward → close.

Each activity goes to its pool's queue: reset to "cpu", generate to the task's
generation pool, step/close to the private queue of the env worker holding the
session (sticky), reward to "serverless". Deterministic: no I/O, no clock, no
heavy imports — only names and pydantic types cross into this module.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError as TemporalTimeoutError

with workflow.unsafe.imports_passed_through():
    from datetime import timedelta

    from pydantic import ValidationError

    from rollart.activities.types import (
        ActivityName,
        CloseInput,
        EnvHandle,
        GenerateInput,
        GenerateResult,
        ResetInput,
        RewardInput,
        RewardResult,
        StepInput,
        StepResult,
        Transcript,
        TurnRecord,
        turn_key,
    )
    from rollart.infra.pools import Pool
    from rollart.workflows import policies
    from rollart.workflows.types import TrajectoryInput, TrajectoryResult

__all__ = ["TrajectoryWorkflow"]

_BAD_INPUT_TYPES = ("InvalidInput", "UnknownComponent")


@workflow.defn(name="TrajectoryWorkflow", failure_exception_types=[ValidationError])
class TrajectoryWorkflow:
    """Runs one episode; a broken env or worker ends it as `failed` (never scored), bad input fails the workflow."""

    def __init__(self) -> None:
        self._turns: list[TurnRecord] = []

    @workflow.query(name="turns")
    def turns(self) -> int:
        """How many turns have been played so far."""
        return len(self._turns)

    @workflow.run
    async def run(self, inp: TrajectoryInput) -> TrajectoryResult:
        task = inp.task
        if task.sampling.n != 1:
            raise ApplicationError(
                f"task {task.name!r}: a multi-turn trajectory samples one completion per turn (sampling.n = 1); "
                "use group_size for GRPO groups",
                type="InvalidInput",
                non_retryable=True,
            )
        tid = workflow.info().workflow_id
        handle: EnvHandle | None = None
        gens: list[GenerateResult] = []
        try:
            handle = await workflow.execute_activity(
                ActivityName.RESET.value,
                ResetInput(env=task.env, env_args=task.env_args, seed=inp.seed, trajectory_id=tid),
                task_queue=Pool.CPU.value,
                result_type=EnvHandle,
                **policies.RESET.kwargs(),
            )
            observation = handle.observation
            for turn in range(task.max_turns):
                gen = await workflow.execute_activity(
                    ActivityName.GENERATE.value,
                    GenerateInput(prompt=observation, sampling=task.sampling, data_key=turn_key(inp.job_id, tid, turn)),
                    task_queue=task.generate_pool.value,
                    result_type=GenerateResult,
                    **policies.GENERATE.kwargs(),
                )
                gens.append(gen)
                action = gen.completions[0].text
                step = await workflow.execute_activity(
                    ActivityName.STEP.value,
                    StepInput(session_id=handle.session_id, action=action),
                    task_queue=handle.queue,
                    result_type=StepResult,
                    **_step_kwargs(handle),
                )
                self._turns.append(
                    TurnRecord(observation=observation, action=action, env_reward=step.reward, done=step.done, info=step.info)
                )
                observation = step.observation
                if step.done:
                    break
            score = await workflow.execute_activity(
                ActivityName.REWARD.value,
                RewardInput(
                    reward=task.reward,
                    transcript=Transcript(task=task.name, seed=inp.seed, turns=self._turns, final_observation=observation),
                ),
                task_queue=Pool.SERVERLESS.value,
                result_type=RewardResult,
                **policies.REWARD.kwargs(),
            )
        except ActivityError as err:
            if _error_type(err) in _BAD_INPUT_TYPES:
                raise ApplicationError(_describe(err), type=_error_type(err), non_retryable=True) from err
            workflow.logger.warning("trajectory %s failed: %s", tid, _describe(err))
            return self._result(inp, tid, handle, gens, status="failed", error=_describe(err))
        finally:
            if handle is not None:
                await self._close(handle)
        return self._result(inp, tid, handle, gens, status="completed", reward=score.value, success=score.success)

    async def _close(self, handle: EnvHandle) -> None:
        try:
            await workflow.execute_activity(
                ActivityName.CLOSE.value,
                CloseInput(session_id=handle.session_id),
                task_queue=handle.queue,
                **policies.CLOSE.kwargs(),
            )
        except ActivityError as err:  # the session dies with its worker anyway
            workflow.logger.warning("closing session %s failed: %s", handle.session_id, _describe(err))

    def _result(
        self,
        inp: TrajectoryInput,
        tid: str,
        handle: EnvHandle | None,
        gens: list[GenerateResult],
        **outcome: Any,
    ) -> TrajectoryResult:
        versions = [v for g in gens for v in (g.policy_version, g.policy_version_end)]
        return TrajectoryResult(
            trajectory_id=tid,
            task=inp.task.name,
            seed=inp.seed,
            turns=len(self._turns),
            policy_version_min=min(versions) if versions else None,
            policy_version_max=max(versions) if versions else None,
            prompt_tokens=sum(g.prompt_tokens for g in gens),
            completion_tokens=sum(c.num_tokens for g in gens for c in g.completions),
            turn_keys=[g.data_key for g in gens],
            env_worker=handle.worker_id if handle else None,
            **outcome,
        )


def _step_kwargs(handle: EnvHandle) -> dict[str, Any]:
    kwargs = policies.STEP.kwargs()
    kwargs["start_to_close_timeout"] = timedelta(seconds=handle.step_timeout_s)
    return kwargs


def _error_type(err: ActivityError) -> str | None:
    cause = err.cause
    return cause.type if isinstance(cause, ApplicationError) else None


def _describe(err: ActivityError) -> str:
    """`step on cpu@host-1: EnvBroken: the env raised ...` — which activity, where, and why."""
    cause = err.cause
    if isinstance(cause, ApplicationError):
        why = f"{cause.type}: {cause.message}" if cause.type else cause.message
    elif isinstance(cause, TemporalTimeoutError):
        why = f"timed out ({cause.type.name if cause.type else 'timeout'})"
    else:
        why = str(cause or err)
    return f"{err.activity_type} failed: {why}"
