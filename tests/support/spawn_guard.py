"""Proof that unit tests start nothing: while one runs, every way to start a process or a Temporal server fails.

`conftest.py` wraps the setup and call of each `unit` test in `no_spawning`. A spawn attempt raises
`SpawnInUnitTest` where it happens and is also recorded, so code that catches the error still fails the
test. Every thread is guarded (a rank group, say, starts its processes from a worker thread); conftest runs
the unit tests first, before any fixture of another tier can have left a thread that starts processes.
"""

from __future__ import annotations

import _posixsubprocess
import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import temporalio.bridge.testing

__all__ = ["SpawnInUnitTest", "no_spawning"]

# (owner, attribute): every path to a new process we know of. subprocess (and asyncio's subprocesses) ends
# in its own alias of _posixsubprocess.fork_exec or in os.posix_spawn, multiprocessing's spawn in
# _posixsubprocess.fork_exec; Temporal's servers start from Rust, behind EphemeralServer.
_SPAWNERS: list[tuple[Any, str]] = [
    (subprocess, "_fork_exec"),
    (_posixsubprocess, "fork_exec"),
    (os, "fork"),
    (os, "forkpty"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
    (os, "system"),
    (temporalio.bridge.testing.EphemeralServer, "start_dev_server"),
    (temporalio.bridge.testing.EphemeralServer, "start_test_server"),
]


class SpawnInUnitTest(RuntimeError):
    """A unit test tried to start a process or a server: it belongs in another tier."""


def _refuse(name: str, attempts: list[str]) -> Callable[..., Any]:
    """A stand-in for the spawning function `name` that records the attempt and raises."""

    def guarded(*args: Any, **kwargs: Any) -> Any:
        attempts.append(name)
        raise SpawnInUnitTest(f"a unit test called {name}: mark it orchestration or integration (tests/conftest.py)")

    return guarded


@contextlib.contextmanager
def no_spawning() -> Iterator[list[str]]:
    """Within the block, starting a process or a Temporal server raises; yields the attempts made."""
    attempts: list[str] = []
    saved = [(owner, attr, owner.__dict__[attr]) for owner, attr in _SPAWNERS if attr in owner.__dict__]
    try:
        for owner, attr, real in saved:
            guarded = _refuse(f"{getattr(owner, '__name__', owner)}.{attr}", attempts)
            setattr(owner, attr, staticmethod(guarded) if isinstance(real, staticmethod) else guarded)
        yield attempts
    finally:
        for owner, attr, real in saved:
            setattr(owner, attr, real)
