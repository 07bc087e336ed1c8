"""Heartbeating while an activity waits on work that reports nothing until it ends (an engine, a torch step)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from temporalio import activity

__all__ = ["heartbeating"]


@contextlib.asynccontextmanager
async def heartbeating(every_s: float, *, first_now: bool = False) -> AsyncIterator[None]:
    """Heartbeat every `every_s` seconds from a side task.

    By default the first beat comes after one interval, so short work (most generations) costs the
    server no heartbeat RPC; `first_now` beats at once (long work that should show it started).
    """

    async def beat() -> None:
        if first_now:
            activity.heartbeat()
        while True:
            await asyncio.sleep(every_s)
            activity.heartbeat()

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
