"""The one error a command raises for input the user can fix, and the exit code it maps to."""

from __future__ import annotations

__all__ = ["EXIT_BAD_INPUT", "EXIT_JOB_FAILED", "UserError", "job_failure"]

EXIT_BAD_INPUT = 2
EXIT_JOB_FAILED = 1


class UserError(Exception):
    """Something the user can fix (a bad flag, spec or path); printed without a traceback, exit code 2."""


def job_failure(e: BaseException) -> str:
    """Why a job's workflow failed, in one line: its cause's type and message (a stall, trajectories that keep
    failing for one reason), not the client's wrapper around it."""
    cause = getattr(e, "cause", None) or e.__cause__ or e
    kind = getattr(cause, "type", None) or type(cause).__name__
    return f"{kind}: {getattr(cause, 'message', None) or cause}"
