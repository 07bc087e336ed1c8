"""Error types that cross from activities to workflows: the `type` names workflows and retry policies match on."""

from __future__ import annotations

from rollart.contracts.errors import ErrorType
from temporalio.exceptions import ApplicationError

__all__ = ["bad_input", "env_broken", "unknown_component"]


def bad_input(message: str) -> ApplicationError:
    """Input no retry can fix (bad env args, a malformed request): fails at once."""
    return ApplicationError(message, type=ErrorType.INVALID_INPUT, non_retryable=True)


def unknown_component(message: str) -> ApplicationError:
    """An env or reward name that is neither registered nor importable on this worker."""
    return ApplicationError(message, type=ErrorType.UNKNOWN_COMPONENT, non_retryable=True)


def env_broken(message: str) -> ApplicationError:
    """An env raised mid-episode: its state is unknown, so the episode cannot go on (not retried)."""
    return ApplicationError(message, type=ErrorType.ENV_BROKEN, non_retryable=True)
