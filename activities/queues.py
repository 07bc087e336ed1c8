"""`describe_queues` on the control queue: backlog and pollers of a job's queues, for its stall checks."""

from __future__ import annotations

import asyncio

from rollart.contracts.activities import DescribeQueuesInput, DescribeQueuesResult, QueueState
from rollart.infra.backlog import queue_stats
from temporalio import activity
from temporalio.client import Client

__all__ = ["QueueActivities"]


class QueueActivities:
    """Reads task-queue descriptions through the control worker's own client (workflows cannot)."""

    def __init__(self, client: Client) -> None:
        self.client = client

    @activity.defn(name="describe_queues")
    async def describe_queues(self, inp: DescribeQueuesInput) -> DescribeQueuesResult:
        """One DescribeTaskQueue per queue, at once: what waits there and who polls it."""
        stats = await asyncio.gather(*(queue_stats(self.client, q) for q in inp.queues))
        return DescribeQueuesResult(queues=[
            QueueState(queue=q, backlog=s.backlog, backlog_age_s=s.backlog_age_s, pollers=s.pollers)
            for q, s in zip(inp.queues, stats)
        ])  # fmt: skip
