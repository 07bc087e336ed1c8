"""`describe_queues` on the control queue: backlog, pollers and live workers of a job's queues, for its stall checks."""

from __future__ import annotations

import asyncio

from temporalio import activity
from temporalio.client import Client

from rollart.contracts.activities import DescribeQueuesInput, DescribeQueuesResult, QueueState
from rollart.infra.config import TemporalConfig
from rollart.infra.temporal.backlog import queue_stats
from rollart.infra.temporal.liveness import last_seen_s_ago, queue_liveness

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
