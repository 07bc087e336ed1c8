"""The calls the rollout driver makes, behind one method, and how a failed one reaches it."""

from __future__ import annotations

import logging
from typing import Any, Protocol

from pydantic import BaseModel
from temporalio.exceptions import ApplicationError

from rollart.contracts.activities import ActivityName
from rollart.contracts.errors import BAD_INPUT, JOB_FAULTS, ErrorType

__all__ = ["CallFailed", "Calls"]


class CallFailed(Exception):
    """A call that failed for good (after its retries): which activity, why, and what kind of failure.

    `error_type` is the activity's ApplicationError type (None for a timeout or an unknown error);
    `timed_out`: the call was never picked up, or its worker died while running it.
    """

    def __init__(self, activity: str, why: str, error_type: str | None = None, timed_out: bool = False) -> None:
        self.activity, self.why, self.error_type, self.timed_out = activity, why, error_type, timed_out
        super().__init__(self.message)

    @property
    def message(self) -> str:
        """`step failed: EnvBroken: the env raised ...`: which activity, and why."""
        return f"{self.activity} failed: {self.why}"

    @property
    def job_fault(self) -> str | None:
        """The error type when the failure is the job's own (contracts.errors.JOB_FAULTS), else None."""
        return self.error_type if self.error_type in JOB_FAULTS else None

    @property
    def bad_input(self) -> bool:
        """The input is wrong: this fails the workflow (or the eval), not just the episode."""
        return self.error_type in BAD_INPUT

    @property
    def session_lost(self) -> bool:
        """A sticky call failed because the env worker holding the session is gone, not because of the env.

        SessionLost: the worker answered but has no such session (it restarted). A timeout: the worker
        never picked the call up (schedule-to-start on its private queue) or died while running it.
        """
        return self.error_type == ErrorType.SESSION_LOST or self.timed_out

    def as_input_error(self) -> ApplicationError:
        """The non-retryable error a bad input ends its workflow with."""
        return ApplicationError(self.message, type=self.error_type, non_retryable=True)

    def mask(self, calls: Calls, who: str) -> str:
        """The one place a failed call is handled: a bad input fails the whole run (raised); any other failure
        is logged and its message returned, for the caller to end `who` as failed (masked, never scored)."""
        if self.bad_input:
            raise self.as_input_error() from self
        calls.logger.warning("%s failed: %s", who, self.message)
        return self.message


class Calls(Protocol):
    """Runs one activity call: on `queue` as a Temporal activity, or in-process; raises `CallFailed`."""

    logger: logging.Logger | logging.LoggerAdapter

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
        """`timeout_s` overrides the activity's start-to-close timeout (an env's own step timeout, say);
        `start_wait_s` how long it may wait to start (a session's worker that leaves it waiting is dead),
        `heartbeat_s` how long it may run without a heartbeat (an engine that stops beating is dead)."""
        ...

    async def agent_workflow(
        self, workflow_type: str, arg: Any, *, trajectory: str, queue: str, timeout_s: float
    ) -> Any:
        """A Temporal-native agent's workflow, run as the calling workflow's child on `queue` for `trajectory`
        ("": the workflow's own) within `timeout_s`; its result, or `CallFailed`. Only inside a workflow: agents
        never play in-process."""
        ...
