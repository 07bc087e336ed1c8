"""Which workers of a queue are alive: Temporal's worker heartbeats (ListWorkers), read for the stall checks.

A poller list cannot tell a dead worker from a busy one: a worker whose slots are all taken stops polling,
and Temporal lists a killed worker's poller for minutes. Heartbeats can: every worker of this SDK sends
one every `temporal.worker_heartbeat_s` (infra/temporal/connection.py sets the interval), busy or not, and a killed
one simply stops. Servers without worker heartbeats (before 1.28, or with them turned off) answer None.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from temporalio.api.enums.v1 import WorkerStatus
from temporalio.api.worker.v1 import WorkerHeartbeat
from temporalio.api.workflowservice.v1 import ListWorkersRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

__all__ = [
    "HEARTBEATS_MISSED",
    "HEARTBEAT_GRACE_S",
    "QueueLiveness",
    "alive",
    "last_seen_s_ago",
    "live_identities",
    "queue_liveness",
]

HEARTBEATS_MISSED = 2
"""A worker that has missed this many of its heartbeats is taken for dead."""

HEARTBEAT_GRACE_S = 5.0
"""On top of the missed heartbeats: room for a slow network or a busy server."""

_UNSUPPORTED = {RPCStatusCode.UNIMPLEMENTED, RPCStatusCode.PERMISSION_DENIED, RPCStatusCode.INVALID_ARGUMENT}


@dataclass(frozen=True)
class QueueLiveness:
    """The heartbeating workers of one queue: how many are alive, and how long ago any was last heard of;
    `identities`: the alive ones' worker identities (rollart's worker ids), sorted."""

    alive: int
    last_heartbeat_s_ago: float | None  # the newest heartbeat of a running worker; None: none ever heard
    identities: tuple[str, ...] = ()


def last_seen_s_ago(last_poll_s_ago: float | None, live: QueueLiveness | None) -> float | None:
    """Since the newest sign of any worker on a queue, a poll or a heartbeat; None when there was none."""
    signs = [s for s in (last_poll_s_ago, live.last_heartbeat_s_ago if live else None) if s is not None]
    return min(signs, default=None)


def alive(hb: WorkerHeartbeat, now: float, interval_s: float) -> bool:
    """Running, and heard from within HEARTBEATS_MISSED of its intervals (plus a grace).

    Its interval is the gap it reports before its last heartbeat, or `interval_s` (this deployment's
    `temporal.worker_heartbeat_s`) where that is shorter or missing: a first heartbeat reports a gap of 0.
    """
    interval = max(hb.elapsed_since_last_heartbeat.ToTimedelta().total_seconds(), interval_s)
    age = now - hb.heartbeat_time.ToSeconds()
    return hb.status == WorkerStatus.WORKER_STATUS_RUNNING and age <= HEARTBEATS_MISSED * interval + HEARTBEAT_GRACE_S


async def queue_liveness(
    client: Client, queue: str, interval_s: float, namespace: str | None = None
) -> QueueLiveness | None:
    """The workers heartbeating on `queue` (`interval_s` as in `alive`); None where the server keeps no heartbeats."""
    try:
        resp = await client.workflow_service.list_workers(
            ListWorkersRequest(namespace=namespace or client.namespace, page_size=1000, query=f"TaskQueue = '{queue}'")
        )
    except RPCError as e:
        if e.status in _UNSUPPORTED:
            return None
        raise
    now = time.time()
    beats = [
        w.worker_heartbeat for w in resp.workers_info if w.worker_heartbeat.status == WorkerStatus.WORKER_STATUS_RUNNING
    ]
    live = [hb for hb in beats if alive(hb, now, interval_s)]
    return QueueLiveness(
        alive=len(live),
        last_heartbeat_s_ago=min((now - hb.heartbeat_time.ToSeconds() for hb in beats), default=None),
        identities=tuple(sorted({hb.worker_identity for hb in live})),
    )


async def live_identities(client: Client, queue: str, interval_s: float) -> list[str] | None:
    """The identities of the workers alive on `queue` (see `alive`), sorted; None where the server keeps no
    heartbeats. A worker killed a moment ago may still be listed (for up to HEARTBEATS_MISSED intervals plus
    the grace): callers route to it with a short schedule-to-start timeout and a fallback."""
    live = await queue_liveness(client, queue, interval_s)
    return None if live is None else list(live.identities)
