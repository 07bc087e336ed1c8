"""The error types that cross from activities to workflows: the `type` of an ApplicationError.

Workflows, retry policies and clients match on these names; activities raise them. One enum, so a
misspelt type is a NameError, not a silently different error. Each type declares whether a retry may
help, and `ErrorType.X.error(message)` builds the ApplicationError with that flag: the retry policies'
`NEVER_RETRY` and every raise agree by construction (tests/test_error_types.py holds the code to it).
"""

from __future__ import annotations

from enum import Enum

from temporalio.exceptions import ApplicationError, CancelledError, TerminatedError, TimeoutError

__all__ = ["BAD_INPUT", "JOB_FAULTS", "NEVER_RETRY", "ErrorType", "failure_of"]


class ErrorType(str, Enum):
    """Why an activity (or a workflow, or a refused update) failed, and whether a retry may help."""

    retryable: bool

    def __new__(cls, value: str, retryable: bool) -> ErrorType:
        member = str.__new__(cls, value)
        member._value_ = value
        member.retryable = retryable
        return member

    # ---- never retried: the same input fails the same way ---------------------------------------
    INVALID_INPUT = "InvalidInput", False  # input no retry can fix: bad env args, a malformed request, a bad job
    UNKNOWN_COMPONENT = "UnknownComponent", False  # an env or reward name neither registered nor importable
    ENV_BROKEN = "EnvBroken", False  # an env raised mid-episode: its state is unknown
    REQUEST_REJECTED = "RequestRejected", False  # the engine refused a request (too long a prompt, say)
    ENGINE_BUSY = (
        "EngineBusy",
        False,
    )  # an engine refused a turn pinned to it (too many waiting): the caller goes elsewhere
    SESSION_LOST = "SessionLost", False  # the worker holds no such session (it restarted): the workflow restores it
    REPLAY_MISMATCH = "ReplayMismatch", False  # a lost session could not be rebuilt by replaying its actions
    AGENT_FAILED = "AgentFailed", False  # an agent program crashed, exited non-zero, was killed or ran past its time
    TRAIN_STEP_FAILED = (
        "TrainStepFailed",
        False,
    )  # the step's own code raised (a shape error, a bad value): it would again
    TRAINER_STATE_MISMATCH = "TrainerStateMismatch", False  # the trainer holds other steps than the workflow sends
    ADAPTERS_NOT_SERVED = "AdaptersNotServed", False  # a LoRA job's turn on an engine built without LoRA
    JOB_STALLED = "JobStalled", False  # a pool had work and no live worker for `stall.fail_after_s`
    JOB_FAILING = "JobFailing", False  # trajectories kept failing for one reason (`training.fail_after_failures`)
    # An agent's chat request the trajectory refuses (the endpoint answers HTTP 400): contracts.agent.TurnRefused
    MAX_TURNS_REACHED = "MaxTurnsReached", False
    NOT_AN_AGENT_TRAJECTORY = "NotAnAgentTrajectory", False
    AGENT_DONE = "AgentDone", False
    HISTORY_MISMATCH = "HistoryMismatch", False  # a request sent as a continuation of what the workflow does not hold

    # ---- retried by the activity's policy: the next attempt may succeed -------------------------
    TRAINER_RANK_FAILED = "TrainerRankFailed", True  # a trainer rank died mid-step: retried on fresh ranks
    WEIGHTS_NOT_PUBLISHED = "WeightsNotPublished", True  # a turn asked for a version not in the store yet
    ENV_RESET_TIMEOUT = "EnvResetTimeout", True  # a reset ran past its time: each attempt builds a fresh env
    ENV_RESET_ERROR = "EnvResetError", True  # a reset raised: each attempt builds a fresh env
    ENV_STEP_TRANSIENT = "EnvStepTransient", True  # a step failed before the env was touched: its state is intact
    ENV_RESTORE_LOST = "EnvRestoreLost", True  # the env server went away while an episode was being restored
    THROWAWAY_ENV_LOST = "EnvSessionLost", True  # a throwaway env's server went away: a retry builds fresh ones
    REWARD_ERROR = "RewardError", True  # a reward function raised (a reward model's server, say)

    def __str__(self) -> str:
        return self.value

    def error(self, message: str, *details: object) -> ApplicationError:
        """The ApplicationError of this type (with `details` for whoever handles it), retryable exactly when the
        type says so."""
        return ApplicationError(message, *details, type=self.value, non_retryable=not self.retryable)


BAD_INPUT: tuple[str, ...] = (ErrorType.INVALID_INPUT.value, ErrorType.UNKNOWN_COMPONENT.value)
"""Errors that mean a workflow's input is wrong: they fail the workflow, not just the episode."""

JOB_FAULTS: tuple[str, ...] = (
    ErrorType.INVALID_INPUT.value,
    ErrorType.UNKNOWN_COMPONENT.value,
    ErrorType.ENV_BROKEN.value,
    ErrorType.REQUEST_REJECTED.value,
    ErrorType.AGENT_FAILED.value,
    ErrorType.ADAPTERS_NOT_SERVED.value,
)
"""Failures of the job itself (its input, env, prompts, agent program or engine settings), which no retry and no
other worker cures: a run of them ends the job (`training.fail_after_failures`). A busy engine or a lost
session is the system's state, not the job's fault."""

NEVER_RETRY: tuple[str, ...] = tuple(t.value for t in ErrorType if not t.retryable)
"""Error types no retry can fix: the activity retry policies' `non_retryable_error_types`."""


def failure_of(err: BaseException) -> tuple[str, str | None]:
    """A failed workflow's (or a child's) cause, as a message and the error type when no retry can cure it: how a
    unit that ended without reporting is counted (failed, masked). The cause is the exception Temporal gives
    both a parent (`ChildWorkflowError.cause`) and a client (`WorkflowFailureError.cause`)."""
    cause = err.__cause__ if err.__cause__ is not None else getattr(err, "cause", None) or err
    if isinstance(cause, ApplicationError):
        kind = cause.type or "ApplicationError"
        return f"{kind}: {cause.message}", (kind if cause.non_retryable else None)
    if isinstance(cause, TimeoutError):
        return f"timed out ({cause.type.name.lower() if cause.type else 'workflow'})", None
    if isinstance(cause, TerminatedError):
        return f"terminated: {cause.message}", None
    if isinstance(cause, CancelledError):
        return "cancelled", None
    return f"{type(cause).__name__}: {cause}", None
