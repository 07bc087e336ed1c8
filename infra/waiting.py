"""Waiting for a dependency that is not up yet (Temporal, the Mooncake master): capped exponential backoff.

A worker may start before its server (a replacement pod, a restarted stack): it retries what is worth
retrying, logging each attempt, and gives up at once on what waiting cannot fix (a bad address, a
missing namespace), or when its optional time limit runs out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Backoff", "DependencyTimeout", "tcp_reachable", "unless_stopped", "wait_for"]

log = logging.getLogger("rollart.waiting")

T = TypeVar("T")


class DependencyTimeout(ConnectionError):
    """A dependency was still unreachable when the wait's time limit ran out."""


@dataclass(frozen=True)
class Backoff:
    """Delays between attempts: `first_s` doubling up to `max_s`; `timeout_s` bounds the whole wait (None: forever)."""

    first_s: float = 0.5
    max_s: float = 10.0
    timeout_s: float | None = None

    def delays(self) -> Iterator[float]:
        """0.5, 1, 2, 4, 8, 10, 10, ... for the defaults."""
        delay = self.first_s
        while True:
            yield delay
            delay = min(delay * 2, self.max_s)


async def wait_for(
    what: str, attempt: Callable[[], Awaitable[T]], transient: Callable[[BaseException], str | None], backoff: Backoff
) -> T:
    """`attempt()` until it succeeds; `transient(e)` says why an error is worth waiting out (None: raise it now)."""
    start = time.monotonic()
    for n, delay in enumerate(backoff.delays(), start=1):
        try:
            result = await attempt()
        except Exception as e:
            why = transient(e)
            if why is None:
                raise
            waited = time.monotonic() - start
            if backoff.timeout_s is not None and waited + delay > backoff.timeout_s:
                if waited >= backoff.timeout_s:
                    raise DependencyTimeout(
                        f"gave up waiting for {what} after {waited:.1f}s ({n} attempts; "
                        f"limit {backoff.timeout_s:g}s): {why}"
                    ) from e
                delay = backoff.timeout_s - waited
            log.warning("waiting for %s (attempt %d): %s", what, n, why)
            await asyncio.sleep(delay)
        else:
            if n > 1:
                log.info("%s reached after %.1fs (%d attempts)", what, time.monotonic() - start, n)
            return result
    raise AssertionError("unreachable: delays() never ends")


async def tcp_reachable(host: str, port: int, timeout_s: float = 3.0) -> None:
    """Open and close one TCP connection to HOST:PORT; raises OSError when nothing listens there."""
    _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    writer.close()
    await writer.wait_closed()


async def unless_stopped(work: Awaitable[T], stop: asyncio.Event) -> T | None:
    """`work`'s result, or None (the work cancelled) if `stop` is set first: SIGTERM ends a process still waiting."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None
