"""The error types that cross from activities to workflows: the `type` of an ApplicationError.

Workflows, retry policies and clients match on these names; activities raise them. One enum, so a
misspelt type is a NameError, not a silently different error.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["BAD_INPUT", "NEVER_RETRY", "ErrorType"]


class ErrorType(str, Enum):
    """Why an activity (or a workflow) failed, as far cares."""

    INVALID_INPUT = "InvalidInput"  # input no retry can fix: bad env args, a malformed request, a bad job
    UNKNOWN_COMPONENT = "UnknownComponent"  # an env or reward name neither registered nor importable
    ENV_BROKEN = "EnvBroken"  # an env raised mid-episode: its state is unknown
    REQUEST_REJECTED = "RequestRejected"  # the engine refused a request (too long a prompt, say)
    ENGINE_BUSY = "EngineBusy"  # an engine refused a turn pinned to it (too many waiting): the caller goes elsewhere
    SESSION_LOST = "SessionLost"  # the worker answered but holds no such session (it restarted)
    REPLAY_MISMATCH = "ReplayMismatch"  # a lost session could not be rebuilt by replaying its actions
    TRAINER_RANK_FAILED = "TrainerRankFailed"  # a trainer rank died mid-step: retried on fresh ranks
    AGENT_FAILED = "AgentFailed"  # an agent program crashed, exited non-zero, was killed or ran past its time
    TRAIN_STEP_FAILED = "TrainStepFailed"  # the step's own code raised (a shape error, a bad value): it would again

    def __str__(self) -> str:
        return self.value


BAD_INPUT: tuple[str, ...] = (ErrorType.INVALID_INPUT.value, ErrorType.UNKNOWN_COMPONENT.value)
"""Errors that mean a workflow's input is wrong: they fail the workflow, not just the episode."""

NEVER_RETRY: tuple[str, ...] = tuple(t.value for t in ErrorType if t is not ErrorType.TRAINER_RANK_FAILED)
"""Error types no retry can fix (a lost trainer rank is the exception: fresh ranks retry the step)."""
