"""The rollout driver's calls as Temporal activities: each on its queue, with its kind's timeouts and retries."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import Priority
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

from rollart.contracts.activities import ActivityName
from rollart.workflows import policies
from rollart.workflows.driver.calls import CallFailed
from rollart.workflows.driver.priority import queue_priority_key

__all__ = ["TemporalCalls", "call_failed"]

POLICIES: dict[ActivityName, policies.ActivityPolicy] = {
    ActivityName.RESET: policies.RESET,
    ActivityName.RESET_GROUP: policies.RESET,
    ActivityName.PROMPTS: policies.RESET,
    ActivityName.RESTORE: policies.RESTORE,
    ActivityName.STEP: policies.STEP,
    ActivityName.STEP_GROUP: policies.STEP,
    ActivityName.CLOSE: policies.CLOSE,
    ActivityName.CHECK: policies.CHECK,
    ActivityName.GENERATE: policies.GENERATE,
    ActivityName.GENERATE_BATCH: policies.GENERATE,
    ActivityName.REWARD: policies.REWARD,
    ActivityName.REWARD_BATCH: policies.REWARD,
    ActivityName.LIVE_ENGINES: policies.DESCRIBE_QUEUES,
    ActivityName.RUN_AGENT: policies.RUN_AGENT,
}
"""How each call may fail (workflows/policies.py); `train_step` is the training workflow's own call."""


class TemporalCalls:
    """`Calls` inside a workflow: `workflow.execute_activity`, an ActivityError turned into `CallFailed`; a
    generation request's rank (its input's `priority`) becomes its activity task's priority on the queue."""

    logger = workflow.logger

    async def call(
        self,
        activity: ActivityName,
        arg: BaseModel,
        *,
        queue: str,
        result_type: Any = None,
        timeout_s: float | None = None,
        start_wait_s: float | None = None,
    ) -> Any:
        kwargs = POLICIES[activity].kwargs(timeout_s=timeout_s, start_wait_s=start_wait_s)
        key = queue_priority_key(getattr(arg, "priority", 0))  # a generation request's rank (driver/priority.py)
        if key is not None:
            kwargs["priority"] = Priority(priority_key=key)
        try:
            return await workflow.execute_activity(
                activity.value, arg, task_queue=queue, result_type=result_type, **kwargs
            )
        except ActivityError as err:
            raise call_failed(err) from err


def call_failed(err: ActivityError) -> CallFailed:
    """Which activity failed, and why: its ApplicationError's type and message, or the kind of timeout."""
    cause = err.cause
    if isinstance(cause, ApplicationError):
        why = f"{cause.type}: {cause.message}" if cause.type else cause.message
        return CallFailed(err.activity_type or "activity", why, error_type=cause.type)
    if isinstance(cause, TemporalTimeoutError):
        why = f"timed out ({cause.type.name if cause.type else 'timeout'})"
        return CallFailed(err.activity_type or "activity", why, timed_out=True)
    return CallFailed(err.activity_type or "activity", str(cause or err))
