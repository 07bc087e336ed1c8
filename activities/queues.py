"""On the control queue: `describe_queues` (backlog, pollers and live workers of a job's queues, for its stall checks)
and `live_engines` (the private queues of a generation pool's live engines, for a single-turn wave to split over).

Liveness is read from Temporal's worker heartbeats (infra/temporal/liveness.py), not from a queue's pollers:
Temporal lists a killed worker's poller for minutes, and a worker whose slots are all busy does not poll at
all. A heartbeat stops the moment a worker dies, so a dead engine drops out of `live_engines` within two
heartbeat intervals (plus a grace); in that window a share sent to its queue waits out its schedule-to-start
timeout (`engine.affinity.start_wait_s`) and goes to the shared queue, so a stale list costs seconds, never
a sample.
"""

from __future__ import annotations

import asyncio

from temporalio import activity
from temporalio.client import Client

from rollart.contracts.activities import DescribeQueuesInput, DescribeQueuesResult, QueueState
from rollart.contracts.generation import LiveEnginesInput, LiveEnginesResult
from rollart.infra.temporal.backlog import queue_stats
from rollart.infra.temporal.liveness import last_seen_s_ago, live_identities, queue_liveness
from rollart.spec.config import TemporalConfig
from rollart.spec.pools import queue_name, session_queue

__all__ = ["QueueActivities"]


class QueueActivities:
    """Reads task-queue descriptions through the control worker's own client (workflows cannot)."""

    def __init__(self, client: Client, heartbeat_s: float = TemporalConfig().worker_heartbeat_s) -> None:
        self.client = client
        self.heartbeat_s = heartbeat_s  # the deployment's worker heartbeat interval (temporal.worker_heartbeat_s)

    @activity.defn(name="describe_queues")
    async def describe_queues(self, inp: DescribeQueuesInput) -> DescribeQueuesResult:
        """All queues at once: what waits there, who polls it, which workers heartbeat on it."""
        return DescribeQueuesResult(queues=list(await asyncio.gather(*(self._describe(q) for q in inp.queues))))

    @activity.defn(name="live_engines")
    async def live_engines(self, inp: LiveEnginesInput) -> LiveEnginesResult:
        """The private queues (`<prefix><pool>@<worker>`) of the workers heartbeating on the pool's shared queue."""
        ids = await live_identities(self.client, queue_name(inp.pool, inp.queue_prefix), self.heartbeat_s)
        return LiveEnginesResult(queues=[session_queue(w, inp.queue_prefix, inp.pool) for w in ids or []])

    async def _describe(self, queue: str) -> QueueState:
        stats, live = await asyncio.gather(
            queue_stats(self.client, queue), queue_liveness(self.client, queue, self.heartbeat_s)
        )
        return QueueState(
            queue=queue,
            backlog=stats.backlog,
            backlog_age_s=stats.backlog_age_s,
            pollers=stats.pollers,
            workers=live.alive if live else None,
            last_seen_s_ago=last_seen_s_ago(stats.last_poll_s_ago, live),
        )
