"""The one error a command raises for input the user can fix, and the exit code it maps to."""

from __future__ import annotations

__all__ = ["EXIT_BAD_INPUT", "UserError"]

EXIT_BAD_INPUT = 2


class UserError(Exception):
    """Something the user can fix (a bad flag, spec or path); printed without a traceback, exit code 2."""
