"""A virtual clock for asyncio: the driver's `await asyncio.sleep(d)` costs no wall time.

The simulated cluster is ordinary asyncio code (rollart's rollout driver, SimCalls, the engines' timers), so it
runs unchanged on an event loop whose `time()` is virtual. When no callback is ready the loop asks its selector
to wait until the next timer; `VirtualSelector` does not wait: it moves the clock to that timer and returns, so
an hour of simulated cluster time takes only as long as the Python that happens in it. Nothing here does I/O
(the loop's self-pipe is registered, never written to): a simulation that waits on a socket would hang, and one
with nothing scheduled and nothing ready is a deadlock, reported as one.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["SimulationDeadlock", "VirtualLoop", "run_virtual"]

T = TypeVar("T")


class SimulationDeadlock(RuntimeError):
    """Nothing is ready and no timer is scheduled: the simulated run waits for something that never comes."""


class VirtualSelector(selectors.SelectSelector):
    """A selector that never blocks: a wait of `timeout` seconds advances the loop's virtual clock instead."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise SimulationDeadlock("the simulation waits with no timer scheduled (a future nobody resolves)")
        if timeout > 0:
            self.now += timeout
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time: `time()` starts at 0 and jumps to each timer as it comes due."""

    def __init__(self) -> None:
        self._virtual = VirtualSelector()
        super().__init__(self._virtual)
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._virtual.now


def run_virtual(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to its end on a fresh `VirtualLoop` (closed afterwards); its result."""
    loop = VirtualLoop()
    try:
        return loop.run_until_complete(main)
    finally:
        _cancel_rest(loop)
        loop.close()


def _cancel_rest(loop: VirtualLoop) -> None:
    """Cancel what `main` left running (a session closing, a timer's task) and let it unwind, as asyncio.run does."""
    rest = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in rest:
        task.cancel()
    if rest:
        loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
