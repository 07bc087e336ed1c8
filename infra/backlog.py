"""How much work waits in a task queue: Temporal's own count, the signal the autoscaler scales on."""

from __future__ import annotations

from dataclasses import dataclass

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

__all__ = ["QueueStats", "queue_stats"]


@dataclass(frozen=True)
class QueueStats:
    """An activity queue's backlog (tasks no worker has taken yet) and its recent add/dispatch rates (per s).

    Temporal refreshes these about every 5 s; a rate is a moving average over the last ~30 s.
    """

    backlog: int
    backlog_age_s: float
    add_rate: float
    dispatch_rate: float


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
    return QueueStats(
        backlog=int(st.approximate_backlog_count),
        backlog_age_s=age.seconds + age.nanos / 1e9,
        add_rate=float(st.tasks_add_rate),
        dispatch_rate=float(st.tasks_dispatch_rate),
    )
