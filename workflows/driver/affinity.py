"""Session affinity: a trajectory's turns go to the engine that holds its prefix cache, and elsewhere when it can't.

A generation pool has many workers, one engine each, all polling the pool's shared queue (`h800`); each also
polls a private queue of its own (`h800@<worker>`). The first turn of a trajectory (or of a lockstep group)
goes to the shared queue, and whoever serves it is named in its result (`GenerateResult.queue`): its later
turns go there, where the prompt so far — every earlier observation and action — is in the engine's prefix
cache. A pinned turn waits at most `start_wait_s` to start; if it times out (the worker is gone, or too busy
to poll), dies with the worker, or the engine refuses it (`EngineBusy`: too many requests waiting), it goes
to the shared queue, and the engine that serves it there becomes the trajectory's. A request no engine would
take (`RequestRejected`) or a bad input fails as it would on the shared queue: no engine is to blame.

Single-turn waves have no later turns: `split_wave` spreads a wave's groups over the pool's live engines
instead, each engine a share through its private queue, with the same fallback.

Pure decisions (`falls_back`, `Pin`, `split_wave`) plus `generate_on`, the one place a generation call is
routed; no I/O, so the workflow sandbox runs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from rollart.contracts.activities import ActivityName
from rollart.contracts.errors import ErrorType
from rollart.contracts.generation import EnginePressure, GenerateResult
from rollart.spec.config import AffinityConfig
from rollart.workflows.driver.calls import CallFailed, Calls

__all__ = ["Pin", "falls_back", "generate_on", "split_wave"]


def falls_back(err: CallFailed) -> bool:
    """Whether a turn that failed on its pinned engine goes to the shared queue: it failed for that engine's sake.

    Yes for a timeout (never started there: the worker is gone or swamped; or it died mid-call) and for an
    error the activity raised after its retries (`EngineBusy`, a dead engine); no for a bad input or a request
    the engine rejected (any engine would), nor for a cancellation (the caller is going away).
    """
    if err.timed_out:
        return True
    return err.error_type is not None and not err.bad_input and err.error_type != ErrorType.REQUEST_REJECTED


@dataclass
class Pin:
    """Which engine serves a unit's turns: its private queue once one has served it ("" before the first turn).

    `moves` counts the turns an engine other than the previous turn's served (its engine was gone or busy,
    or affinity is off); `pressure` is what the last turn's engine reported.
    """

    queue: str = ""
    worker: str = ""
    moves: int = 0
    pressure: EnginePressure | None = None

    def follow(self, result: GenerateResult) -> None:
        """The engine that served this turn is the one for the next."""
        if self.worker and result.worker_id and result.worker_id != self.worker:
            self.moves += 1
        self.queue, self.worker, self.pressure = result.queue, result.worker_id or self.worker, result.pressure

    def target(self, affinity: AffinityConfig) -> str | None:
        """The private queue the next turn should try first, or None: the shared queue."""
        return self.queue if affinity.sticky and self.queue else None


async def generate_on(
    calls: Calls,
    affinity: AffinityConfig,
    pin: Pin,
    activity: ActivityName,
    arg: BaseModel,
    *,
    shared: str,
    result_type: Any,
) -> Any:
    """`activity` (generate or generate_batch) on the pinned engine's queue, else — or if it fails there for the
    engine's sake (`falls_back`) — on the pool's `shared` queue; `pin` follows the engine that served it."""
    result = await _pinned_or_shared(calls, affinity, pin.target(affinity), activity, arg, shared, result_type)
    first = result[0] if isinstance(result, list) else result
    pin.follow(first)
    return result


async def _pinned_or_shared(
    calls: Calls,
    affinity: AffinityConfig,
    pinned: str | None,
    activity: ActivityName,
    arg: BaseModel,
    shared: str,
    result_type: Any,
) -> Any:
    if pinned:
        try:
            return await calls.call(
                activity,
                arg,
                queue=pinned,
                result_type=result_type,
                start_wait_s=affinity.start_wait_s,
                heartbeat_s=affinity.heartbeat_s,
            )
        except CallFailed as err:
            if not falls_back(err):
                raise
            calls.logger.info("%s on %s: %s; going to %s", activity.value, pinned, err.message, shared)
    return await calls.call(activity, arg, queue=shared, result_type=result_type, heartbeat_s=affinity.heartbeat_s)


def split_wave(groups: int, engines: list[str], offset: int = 0) -> list[tuple[str | None, range]]:
    """A wave of `groups` single-turn groups as (engine queue, group indices) shares: one per live engine, as
    even as whole groups allow (contiguous), at most one per group. One engine or none known: the whole wave
    on the shared queue (None), where whichever worker is free takes it.

    `offset` rotates which engines take the shares when there are more engines than groups, so that small
    waves do not all land on the first engines.
    """
    if len(engines) <= 1 or groups <= 1:
        return [(None, range(groups))]
    k = min(len(engines), groups)
    chosen = [engines[(offset + i) % len(engines)] for i in range(k)]
    bounds = [groups * i // k for i in range(k + 1)]
    return [(queue, range(bounds[i], bounds[i + 1])) for i, queue in enumerate(chosen)]
