"""The rollout driver's calls as Temporal activities: each on its queue, with its kind's timeouts and retries."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import Priority
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

from rollart.contracts.activities import ActivityName
from rollart.contracts.agent_workflow import agent_workflow_id
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
        heartbeat_s: float | None = None,
    ) -> Any:
        kwargs = POLICIES[activity].kwargs(timeout_s=timeout_s, start_wait_s=start_wait_s, heartbeat_s=heartbeat_s)
        key = queue_priority_key(getattr(arg, "priority", 0))  # a generation request's rank (driver/priority.py)
        if key is not None:
            kwargs["priority"] = Priority(priority_key=key)
        try:
            return await workflow.execute_activity(
                activity.value, arg, task_queue=queue, result_type=result_type, **kwargs
            )
        except ActivityError as err:
            raise call_failed(err) from err

    async def agent_workflow(
        self, workflow_type: str, arg: Any, *, trajectory: str, queue: str, timeout_s: float
    ) -> Any:
        """Run a Temporal-native agent's workflow as this workflow's child (its id names `trajectory`, so that its
        model calls find it), once: a rerun would replay its model calls into a conversation that has moved on."""
        try:
            return await workflow.execute_child_workflow(
                workflow_type,
                arg,
                id=agent_workflow_id(workflow.info().workflow_id, trajectory),
                task_queue=queue,
                execution_timeout=timedelta(seconds=timeout_s),
            )
        except ChildWorkflowError as err:
            raise _child_failed(f"agent workflow {workflow_type}", err.cause) from err


def _child_failed(what: str, cause: BaseException | None) -> CallFailed:
    """Why a child workflow failed: the ApplicationError it raised (an Agents SDK error's type is its class name),
    a timeout, or the failure of an activity it ran (a model call that kept failing)."""
    if isinstance(cause, ActivityError):
        inner = call_failed(cause)
        return CallFailed(what, inner.message, timed_out=inner.timed_out)
    if isinstance(cause, ApplicationError):
        return CallFailed(what, f"{cause.type}: {cause.message}" if cause.type else cause.message, cause.type)
    if isinstance(cause, TemporalTimeoutError):
        return CallFailed(what, "ran past its timeout_s", timed_out=True)
    return CallFailed(what, str(cause) if cause is not None else "failed")


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
