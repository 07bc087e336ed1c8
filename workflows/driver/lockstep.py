"""Play rollout units — episodes or lockstep groups — phase by phase; a failed call fails its unit, not the rest.

One unit is one trajectory (or group) advancing on its own; several are the synchronous baseline's barrier:
every unit's phase before any unit's next, so the slowest reset, answer or step holds up the batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

from rollart.contracts.activities import RewardResult
from rollart.contracts.rollouts import TrajectoryResult
from rollart.workflows.driver.calls import CallFailed, Calls

__all__ = ["Unit", "play"]

T = TypeVar("T")

Report = Callable[[list[TrajectoryResult]], Awaitable[None]]


class Unit(Protocol):
    """What `play` drives: an `Episode` (its own session) or a `GroupEpisode` (members sharing one)."""

    calls: Calls
    error: str | None
    error_type: str | None  # the job's own fault, when it is one (CallFailed.job_fault)

    @property
    def owner_id(self) -> str: ...
    @property
    def playing(self) -> bool: ...
    async def start(self) -> None: ...
    async def generate(self) -> None: ...
    async def step(self) -> None: ...
    async def score(self) -> list[RewardResult]: ...
    async def close(self) -> None: ...
    def results(self, scores: list[RewardResult] | None) -> list[TrajectoryResult]: ...


async def play(units: Sequence[Unit], report: Report | None = None) -> list[TrajectoryResult]:
    """start → (generate → step)* while any member plays → score → close, for every unit in lockstep.

    A call that fails for good fails its unit (later phases skip it; its members end `failed`, never
    scored); a bad input fails the whole run. Each unit reports its results (`report`) as soon is
    scored, its session closing meanwhile (the close needs neither), and ends once both are done.
    """
    try:
        await _phase(units, lambda u: u.start())
        while live := [u for u in units if u.playing]:
            await _phase(live, lambda u: u.generate())
            await _phase(live, lambda u: u.step())
    except GeneratorExit:
        raise  # torn down: see _torn_down
    except BaseException:
        await asyncio.gather(*(u.close() for u in units))
        raise
    per_unit = await asyncio.gather(*(_finish(u, report) for u in units))
    return [r for results in per_unit for r in results]


async def _finish(unit: Unit, report: Report | None) -> list[TrajectoryResult]:
    """Score → report, with the session's close running alongside; the unit ends once both are done."""
    closing = asyncio.ensure_future(unit.close())

    async def score_and_report() -> list[TrajectoryResult]:
        results = unit.results(await guarded(unit, unit.score))
        if report is not None:
            await report(results)
        return results

    return await _then(score_and_report(), lambda: closing)


async def _then(work: Awaitable[T], cleanup: Callable[[], Awaitable[object]]) -> T:
    """`await work`, then `await cleanup()` however work ended: a `finally` that knows when it must not wait.

    When the worker drops a workflow without cancelling it (shutdown, a cache eviction that outlives its
    tasks), Python closes each suspended coroutine by throwing GeneratorExit into it; a coroutine that
    awaits anything then is reported as "coroutine ignored GeneratorExit". No cleanup is owed then: the
    workflow's history is where it is, and the run that replays it closes what it opened.
    """
    try:
        value = await work
    except GeneratorExit:
        raise
    except BaseException:
        await cleanup()
        raise
    await cleanup()
    return value


async def _phase(units: Sequence[Unit], call: Callable[[Unit], Awaitable[T]]) -> list[T | None]:
    """`call` for every unit at once (the barrier); None for a unit that failed (now or before)."""
    outcomes = await asyncio.gather(*(guarded(u, lambda u=u: call(u)) for u in units), return_exceptions=True)
    for out in outcomes:
        if isinstance(out, BaseException):
            raise out
    return outcomes  # type: ignore[return-value]


async def guarded(unit: Unit, action: Callable[[], Awaitable[T]]) -> T | None:
    """Run one of a unit's calls unless it has failed: a call that failed for good fails the unit (logged,
    later phases skipped); a bad input fails the run with a non-retryable error."""
    if unit.error is not None:
        return None
    try:
        return await action()
    except CallFailed as err:
        unit.error = err.mask(unit.calls, unit.owner_id)
        unit.error_type = err.job_fault
        return None
