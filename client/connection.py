"""Riding out a Temporal outage on the client side: which errors mean "unreachable", and saying so once per outage.

A client (`rollart train`, `attach`, `rollout`, `status --follow`) only follows work that lives in
Temporal, so a server that goes away is a pause, not a failure: the command keeps its `Client` (its
channel reconnects by itself), retries with a capped backoff, prints one line when the server goes away
and one when it is back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TypeVar

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from rollart.infra.temporal.connection import NamespaceNotFound, TemporalAddressError, connect
from rollart.infra.temporal.tls import TemporalSecurityError, is_tls_failure
from rollart.spec.config import StoreConfig, TemporalConfig

__all__ = ["Outage", "connect_retrying", "is_refused", "is_unreachable", "probe", "retry_unreachable"]

T = TypeVar("T")

# What a dead or restarting server looks like from the client: no connection, or a call cut off on the way.
# (Not DEADLINE_EXCEEDED: a query nobody answers times out on a live server.)
_UNREACHABLE = {RPCStatusCode.UNAVAILABLE, RPCStatusCode.CANCELLED}
_TRANSPORT_WORDS = ("transport error", "tcp connect error", "connection refused", "broken pipe", "connection reset")
# Of those, what only a server that is not there gives: nothing listens. A call cut off on the way (CANCELLED:
# "operation was canceled", "Timeout expired") also comes from a live server that is slow or recycles a
# connection, so it starts an outage only when the next try fails too.
_REFUSED_WORDS = ("tcp connect error", "connection refused")


def is_unreachable(e: BaseException) -> bool:
    """True for errors that say the server could not be reached (retry), False for answers it gave (don't).

    A TLS handshake that failed, or credentials the server refused, is not an outage: waiting changes neither.
    """
    if isinstance(e, (TemporalAddressError, NamespaceNotFound, TemporalSecurityError)):  # an answer, or no server
        return False
    if is_tls_failure(str(e)):
        return False
    if isinstance(e, RPCError):
        return e.status in _UNREACHABLE or any(w in str(e).lower() for w in _TRANSPORT_WORDS)
    return isinstance(e, (ConnectionError, OSError)) or any(w in str(e).lower() for w in _TRANSPORT_WORDS)


def is_refused(e: BaseException) -> bool:
    """An unreachable error that only a server that is not there gives (nothing listens, a connect that failed):
    an outage at once."""
    if isinstance(e, RPCError) and e.status == RPCStatusCode.UNAVAILABLE:
        return True
    return isinstance(e, ConnectionError) or any(w in str(e).lower() for w in _REFUSED_WORDS)


@dataclass
class Outage:
    """One client's view of the server: tells the user once when it goes away and once when it is back."""

    say: Callable[[str], None] = print
    min_delay_s: float = 0.5
    max_delay_s: float = 5.0
    since: float | None = None  # monotonic time the server was last heard from before this outage; None: it answers
    outages: int = 0
    _heard: float | None = field(default=None, init=False)  # the last answer (the SDK retries ~10 s before it gives up)
    _delay_s: float = field(default=0.0, init=False)
    _suspect: bool = field(default=False, init=False)  # a call was cut off since the last answer

    @property
    def down(self) -> bool:
        return self.since is not None

    def failed(self, e: BaseException) -> None:
        """An unreachable error: the first of an outage is printed, with the error.

        A refused connection starts the outage at once; a call cut off on the way only when the next try fails
        too, with no answer between: a loaded server that cuts one call off is slow, not gone.
        """
        if self.since is None and not self._suspect and not is_refused(e):
            self._suspect = True
            return
        if self.since is None:
            self.since = self._heard or time.monotonic()
            self.outages += 1
            self._delay_s = self.min_delay_s
            first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            self.say(f"Temporal unreachable, retrying ({first_line})")

    def ok(self) -> None:
        """The server answered: if it was away, say for how long (since it last answered)."""
        self._heard = time.monotonic()
        self._suspect = False
        if self.since is not None:
            self.say(f"Temporal is back after {self._heard - self.since:.0f} s")
            self.since = None

    def next_delay(self) -> float:
        """The wait before the next try during an outage: doubling, capped at `max_delay_s`."""
        delay, self._delay_s = self._delay_s, min(max(self._delay_s, self.min_delay_s) * 2, self.max_delay_s)
        return max(delay, self.min_delay_s)


async def probe(client: Client, outage: Outage, timeout_s: float = 2.0) -> bool:
    """One health check without the SDK's retries (which take ~10 s to give up): is the server there now?

    A server too slow to answer within `timeout_s` says so itself (DEADLINE_EXCEEDED): it is there.
    """
    try:
        await client.service_client.check_health(retry=False, timeout=timedelta(seconds=timeout_s))
    except RPCError as e:
        if e.status != RPCStatusCode.DEADLINE_EXCEEDED:
            return _unreachable(e, outage)
    except Exception as e:
        return _unreachable(e, outage)
    outage.ok()
    return True


def _unreachable(e: Exception, outage: Outage) -> bool:
    """A failed probe: an unreachable error is the outage's to judge (False); any other is raised."""
    if not is_unreachable(e):
        raise e
    outage.failed(e)
    return False


async def retry_unreachable(
    call: Callable[[], Awaitable[T]], outage: Outage, give_up_after_s: float | None = None
) -> T:
    """Run `call` until it succeeds, waiting out unreachable errors (for at most `give_up_after_s`, then the last
    one is raised); any other error is raised at once."""
    deadline = None if give_up_after_s is None else time.monotonic() + give_up_after_s
    while True:
        try:
            value = await call()
        except Exception as e:
            if not is_unreachable(e) or (deadline is not None and time.monotonic() >= deadline):
                raise
            outage.failed(e)
            await asyncio.sleep(outage.next_delay())
            continue
        outage.ok()
        return value


async def connect_retrying(
    temporal: TemporalConfig, store: StoreConfig, outage: Outage, give_up_after_s: float | None = None
) -> Client:
    """Connect, retrying while the server is unreachable (up to `give_up_after_s`, then the ConnectionError)."""
    return await retry_unreachable(lambda: connect(temporal, store), outage, give_up_after_s)
