"""`rollart ...` in this process: the exit code and what it printed, without paying a Python start per call."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from rollart.cli import run

__all__ = ["Ran", "rollart"]


@dataclass(frozen=True)
class Ran:
    """One command's exit code and output, as a shell would see them."""

    returncode: int
    stdout: str
    stderr: str


def rollart(capsys: pytest.CaptureFixture[str], *args: str) -> Ran:
    """Run `rollart ARGS` through `rollart.cli.run`, capturing what it prints (earlier output is dropped)."""
    capsys.readouterr()
    rc = run(list(args))
    out = capsys.readouterr()
    return Ran(rc, out.out, out.err)
