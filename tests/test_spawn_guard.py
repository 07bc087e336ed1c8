"""The guard that keeps unit tests honest refuses every way a test could start a process or a Temporal server."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import subprocess
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.support.spawn_guard import SpawnInUnitTest, no_spawning


def _in_a_thread(fn: Callable[[], object]) -> None:
    """Run `fn` on another thread and re-raise what it raised (a rank group starts its ranks from one)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # handed to the test thread
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if errors:
        raise errors[0]


def _run(coro: Coroutine[Any, Any, object]) -> None:
    """Run a coroutine on a loop of its own (the test is sync)."""
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(coro)
    finally:
        loop.close()


async def _asyncio_subprocess() -> None:
    await asyncio.create_subprocess_exec("true")


STARTS: dict[str, Callable[[], object]] = {
    "subprocess.run": lambda: subprocess.run(["true"], check=True),
    "asyncio subprocess": lambda: _run(_asyncio_subprocess()),
    "multiprocessing spawn": lambda: multiprocessing.get_context("spawn").Process(target=print).start(),
    "os.fork": lambda: os.fork(),  # looked up when called: the guard has replaced it by then
    "os.system": lambda: os.system("true"),
    "a subprocess from another thread": lambda: _in_a_thread(lambda: subprocess.run(["true"], check=True)),
    "a Temporal dev server": lambda: _run(WorkflowEnvironment.start_local()),
    "the time-skipping server": lambda: _run(WorkflowEnvironment.start_time_skipping()),
}


@pytest.mark.parametrize("start", list(STARTS), ids=list(STARTS))
def test_the_guard_refuses_and_records_every_start(start: str) -> None:
    with no_spawning() as attempts:  # nested inside this unit test's own guard, which sees nothing
        with pytest.raises(SpawnInUnitTest, match="mark it orchestration or integration"):
            STARTS[start]()
    assert attempts, f"{start} was refused but not recorded"


def test_the_guard_puts_everything_back() -> None:
    before = (subprocess._fork_exec, os.fork, WorkflowEnvironment.start_local)  # type: ignore[attr-defined]
    with no_spawning():
        pass
    assert (subprocess._fork_exec, os.fork, WorkflowEnvironment.start_local) == before  # type: ignore[attr-defined]
