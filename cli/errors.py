"""The one error a command raises for input the user can fix, and the exit codes: 2 for it, 1 for a failed job."""

from __future__ import annotations

__all__ = ["EXIT_BAD_INPUT", "EXIT_JOB_FAILED", "UserError"]

EXIT_BAD_INPUT = 2
EXIT_JOB_FAILED = 1


class UserError(Exception):
    """Something the user can fix (a bad flag, spec or path); printed without a traceback, exit code 2."""
