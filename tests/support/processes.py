"""Waiting on what a process a test started prints (a worker's "ready: pool=..." line)."""

from __future__ import annotations

import selectors
import subprocess
import time

__all__ = ["wait_for_output"]


def wait_for_output(proc: subprocess.Popen[str], needle: str, timeout_s: float) -> str:
    """The process's output up to the line holding `needle`; fails with that output if it exits or times out."""
    assert proc.stdout is not None
    seen: list[str] = []
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sel.select(timeout=1.0):
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            seen.append(line)
            if needle in line:
                return "".join(seen)
    raise AssertionError(f"no {needle!r} within {timeout_s:g}s (exit {proc.poll()}):\n" + "".join(seen[-40:]))
