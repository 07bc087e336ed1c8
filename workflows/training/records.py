"""What a trained step does to the training state, its `StepRecord`, and the job's status and result.

The step's record is what the progress bar, metrics.jsonl and the plots see; `success_sampled` counts the
groups dynamic sampling filtered since the step before, so a policy that solves everything is not judged on
the batch alone. Entropy control (workflows/entropy_control.py) and the stop rule (workflows/stopping.py) are
applied here to the state they live in. Pure: `now` is workflow time.
"""

from __future__ import annotations

import statistics

from rollart.contracts.activities import SampleRef, TrainStepResult
from rollart.contracts.training import (
    HISTORY_KEPT,
    EndedBy,
    StepRecord,
    TaskTokens,
    TrainingPlan,
    TrainingResult,
    TrainingState,
    TrainingStatus,
)
from rollart.spec.config import TrainerConfig
from rollart.workflows import entropy_control, stopping
from rollart.workflows.training import pressure

__all__ = ["apply_step", "ended_by", "learned", "result", "status", "step_record", "task_tokens"]


def step_record(
    state: TrainingState,
    step: int,
    batch: list[SampleRef],
    res: TrainStepResult,
    now: float,
    admission_cap: int | None = None,
) -> StepRecord:
    """The record of step `step`, trained on `batch`, with the ledger as it stands after it and the engines as
    they last reported (and `admission_cap`, the engine-pressure cap then, when admission is adaptive)."""
    by_task: dict[str, list[bool]] = {}
    for x in batch:
        by_task.setdefault(x.task, []).append(x.success)
    staleness = [step - x.policy_version_min for x in batch]
    sampled = len(batch) + state.filtered_since_step  # what the policy played for this step, filtered or not
    engines = pressure.summary(state.admission)
    return StepRecord(
        step=step,
        version=res.version,
        time=now,
        samples=len(batch),
        reward_mean=statistics.fmean(x.reward for x in batch),
        success_rate=statistics.fmean(float(x.success) for x in batch),
        success_sampled=(sum(x.success for x in batch) + state.filtered_successes_since_step) / sampled,
        task_success={k: statistics.fmean(map(float, v)) for k, v in by_task.items()},
        staleness_mean=statistics.fmean(staleness),
        staleness_max=max(staleness),
        completion_tokens=sum(x.completion_tokens for x in batch),
        task_tokens=task_tokens(batch),
        started=state.started,
        trained=state.trained,
        dropped=state.dropped,
        failed=state.failed,
        in_flight=len(state.in_flight),
        buffered=len(state.buffer),
        filtered=state.filtered,
        train=res.metrics,
        admission_cap=admission_cap,
        kv_usage=engines.kv_usage if engines else None,
        preempted=engines.preempted if engines else None,
        prefix_hit_rate=engines.prefix_hit_rate if engines else None,
        placement=dict(state.placement.assignment) if state.placement else {},
    )


def task_tokens(batch: list[SampleRef]) -> dict[str, TaskTokens]:
    """Each task's trajectories in `batch` and their tokens; a result without an uncached count (recorded before
    there was one) counts its whole prompt."""
    out: dict[str, TaskTokens] = {}
    for x in batch:
        out.setdefault(x.task, TaskTokens()).add(x.prompt_tokens, x.uncached_prompt_tokens, x.completion_tokens)
    return out


def apply_step(
    state: TrainingState,
    trainer: TrainerConfig,
    batch: list[SampleRef],
    res: TrainStepResult,
    now: float,
    admission_cap: int | None = None,
) -> StepRecord:
    """The state after a step that trained `batch` with `trainer` (its entropy weight included) and returned `res`:
    the new version, the trained count, the next entropy weight, the step's record in the history; the count
    of groups filtered since the step starts again."""
    step = state.step
    state.step = res.version
    state.trained += len(batch)
    if trainer.loss.entropy_target is not None:
        entropy = res.metrics.get(entropy_control.measured(trainer.loss))
        state.entropy_coef = entropy_control.next_coef(trainer.loss, trainer.loss.entropy_coef, entropy)
    record = step_record(state, step, batch, res, now, admission_cap)
    state.history = [*state.history, record][-HISTORY_KEPT:]
    state.filtered_since_step = state.filtered_successes_since_step = 0
    return record


def learned(plan: TrainingPlan, state: TrainingState, record: StepRecord) -> bool:
    """`training.stop_when`: count the steps its success has held; once long enough (before the cap: at the cap
    the job ends by its steps anyway) the job ends by it. Whether it did just now; without a rule nothing changes."""
    rule = plan.training.stop_when
    if rule is None:
        return False
    state.stop_held = stopping.held(rule, state.stop_held, record.played_success)
    if stopping.should_stop(rule, state.stop_held) and state.step < plan.training.steps:
        state.ended_by = "stop_when"
        return True
    return False


def ended_by(plan: TrainingPlan, state: TrainingState) -> EndedBy:
    """Why the loop ended: its stop rule held, it trained all its steps, or it was sent `stop`."""
    if state.ended_by is not None:
        return state.ended_by
    return "steps" if state.step >= plan.training.steps else "stop_signal"


def status(job_id: str, plan: TrainingPlan, state: TrainingState, *, done: bool) -> TrainingStatus:
    """The `status` query's answer: where the loop is, and every term of the ledger."""
    t = plan.training
    return TrainingStatus(
        job_id=job_id,
        step=state.step,
        steps=t.steps,
        version=state.step,
        async_bound=t.async_bound,
        rollout_mode=t.rollout_mode,
        started=state.started,
        trained=state.trained,
        dropped=state.dropped,
        failed=state.failed,
        in_flight=len(state.in_flight),
        buffered=len(state.buffer),
        filtered=state.filtered,
        paused=state.paused,
        stopping=state.stop_requested,
        done=done,
        ledger_balanced=state.ledger_balanced,
        history=state.history,
        started_at=state.started_at,
        restores=state.restores,
        duplicates_ignored=state.duplicates_ignored,
        stalls=state.stall.stalls,
        stop_when=t.stop_when,
        stop_held=state.stop_held,
        ended_by=state.ended_by,
        in_flight_limit=t.in_flight_limit,
        admission_cap=pressure.current_cap(plan, state),
        admission_cuts=state.admission.cuts,
        engine_moves=state.engine_moves,
        engines=state.admission.engines,
        placement=state.placement,
    )


def result(job_id: str, plan: TrainingPlan, state: TrainingState) -> TrainingResult:
    """What the finished job returns: what is still in flight counts as cancelled, the buffer as unused."""
    t = plan.training
    return TrainingResult(
        job_id=job_id,
        steps=state.step,
        version=state.step,
        started=state.started,
        trained=state.trained,
        dropped=state.dropped,
        failed=state.failed,
        cancelled_in_flight=len(state.in_flight),
        buffered_unused=len(state.buffer),
        last=state.history[-1] if state.history else None,
        filtered=state.filtered,
        ended_by=ended_by(plan, state),
        max_steps=t.steps,
        stop_when=t.stop_when,
    )
