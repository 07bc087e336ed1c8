"""How much work waits in a task queue: Temporal's own count, the signal the autoscaler scales on."""

from __future__ import annotations

import time
from dataclasses import dataclass

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

__all__ = ["POLLER_FRESH_S", "QueueStats", "queue_stats"]

POLLER_FRESH_S = 90.0
"""A poller last seen longer ago than this is taken for gone (Temporal lists pollers for ~5 min after they
stop; a live worker with free slots polls again at once, and an idle long poll ends within ~70 s)."""


@dataclass(frozen=True)
class QueueStats:
    """An activity queue's backlog (tasks no worker has taken yet) and its recent add/dispatch rates (per s).

    Temporal refreshes these about every 5 s; a rate is a moving average over the last ~30 s.
    """

    backlog: int
    backlog_age_s: float
    add_rate: float
    dispatch_rate: float
    pollers: int = 0  # workers seen polling the queue in the last POLLER_FRESH_S
    last_poll_s_ago: float | None = None  # since the newest poll Temporal lists; None: no poller listed


async def queue_stats(client: Client, queue: str, namespace: str | None = None) -> QueueStats:
    """`describe_task_queue` with stats, for activity tasks of `queue`."""
    resp = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=namespace or client.namespace,
            task_queue=TaskQueue(name=queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
            report_stats=True,
        )
    )
    st = resp.stats
    age = st.approximate_backlog_age
    now = time.time()
    fresh = [p for p in resp.pollers if now - p.last_access_time.ToSeconds() <= POLLER_FRESH_S]
    return QueueStats(
        backlog=int(st.approximate_backlog_count),
        backlog_age_s=age.seconds + age.nanos / 1e9,
        add_rate=float(st.tasks_add_rate),
        dispatch_rate=float(st.tasks_dispatch_rate),
        pollers=len(fresh),
        last_poll_s_ago=min((now - p.last_access_time.ToSeconds() for p in resp.pollers), default=None),
    )
