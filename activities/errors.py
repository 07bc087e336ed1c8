"""Error types that cross from activities to workflows: the `type` names workflows and retry policies match on."""

from __future__ import annotations

from temporalio.exceptions import ApplicationError

from rollart.contracts.errors import ErrorType
from rollart.infra.store.payload import StoreError

__all__ = ["INFRA_ERRORS", "bad_input", "env_broken", "train_step_failed", "unknown_component"]

INFRA_ERRORS: tuple[type[BaseException], ...] = (StoreError, OSError)
"""What a train step may raise that is not its own doing: the store briefly unavailable, a file system or network
error (OSError covers ConnectionError and TimeoutError). A retry may succeed; anything else the step raised would
happen again."""


def bad_input(message: str) -> ApplicationError:
    """Input no retry can fix (bad env args, a malformed request): fails at once."""
    return ErrorType.INVALID_INPUT.error(message)


def unknown_component(message: str) -> ApplicationError:
    """An env or reward name that is neither registered nor importable on this worker."""
    return ErrorType.UNKNOWN_COMPONENT.error(message)


def env_broken(message: str) -> ApplicationError:
    """An env raised mid-episode: its state is unknown, so the episode cannot go on (not retried)."""
    return ErrorType.ENV_BROKEN.error(message)


def train_step_failed(job_id: str, step: int, cause: BaseException) -> ApplicationError:
    """The step's own code raised (a shape error, an index out of range, a bad value): every retry would too.

    Not retried: the training workflow fails with the step, the job and the cause, instead of retrying forever.
    """
    return ErrorType.TRAIN_STEP_FAILED.error(
        f"train step {step} of job {job_id!r} failed: {type(cause).__name__}: {cause}. The step's own code raised, "
        "so a retry would fail the same way; fix the cause (the model, the data or the trainer config) and resume"
    )
