"""Reading workflow histories: when each activity was scheduled, started and finished, and on which queue.

One reader for the benchmarks (Temporal's overhead per activity), the run
timeline (each pool's busy time) and the tests (which queue and worker ran what).
"""

from __future__ import annotations

from dataclasses import dataclass

from temporalio.client import WorkflowHistory

__all__ = ["ActivitySpan", "activity_spans", "busy_seconds", "pool_of"]


@dataclass(frozen=True)
class ActivitySpan:
    """One activity as its workflow's history saw it (times in epoch seconds; 0 when it never got there)."""

    activity_type: str
    task_queue: str
    worker_identity: str
    scheduled: float
    started: float
    completed: float
    next_command: float  # when the workflow scheduled its next activity or ended (0 if neither)
    succeeded: bool

    @property
    def pool(self) -> str:
        return pool_of(self.task_queue)


def pool_of(task_queue: str) -> str:
    """`cpu@worker-7` → `cpu`: a worker's private queue belongs to its pool."""
    return task_queue.split("@", 1)[0]


def activity_spans(history: WorkflowHistory) -> list[ActivitySpan]:
    """Every activity in schedule order, with the identity of the worker that ran its last attempt."""
    rows: dict[int, dict] = {}
    order: list[int] = []
    waiting: list[int] = []  # finished activities whose workflow has not yet issued its next command
    for e in history.events:
        t = e.event_time.ToDatetime().timestamp()
        if e.HasField("activity_task_scheduled_event_attributes"):
            a = e.activity_task_scheduled_event_attributes
            for sid in waiting:
                rows[sid]["next_command"] = t
            waiting = []
            rows[e.event_id] = {
                "activity_type": a.activity_type.name,
                "task_queue": a.task_queue.name,
                "worker_identity": "",
                "scheduled": t,
                "started": 0.0,
                "completed": 0.0,
                "next_command": 0.0,
                "succeeded": False,
            }
            order.append(e.event_id)
        elif e.HasField("activity_task_started_event_attributes"):
            a = e.activity_task_started_event_attributes
            rows[a.scheduled_event_id].update(started=t, worker_identity=a.identity)
        elif e.HasField("activity_task_completed_event_attributes"):
            sid = e.activity_task_completed_event_attributes.scheduled_event_id
            rows[sid].update(completed=t, succeeded=True)
            waiting.append(sid)
        elif e.HasField("activity_task_failed_event_attributes"):
            sid = e.activity_task_failed_event_attributes.scheduled_event_id
            rows[sid].update(completed=t)
            waiting.append(sid)
        elif e.HasField("workflow_execution_completed_event_attributes") or e.HasField(
            "workflow_execution_continued_as_new_event_attributes"
        ):
            for sid in waiting:
                rows[sid]["next_command"] = t
            waiting = []
    return [ActivitySpan(**rows[i]) for i in order]


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of intervals: how long at least one of them was running."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e > end:
            total += e - max(s, end)
            end = e
    return total
