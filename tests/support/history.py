"""Reading workflow histories in tests: every payload's size, activities with their queues and workers."""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import Message
from temporalio.api.common.v1 import Payload
from temporalio.client import WorkflowHistory


def payload_sizes(history: WorkflowHistory) -> list[int]:
    """Sizes of every Payload anywhere in the history's events (inputs, results, failures, heartbeats)."""
    sizes: list[int] = []

    def walk(msg: Message) -> None:
        if isinstance(msg, Payload):
            sizes.append(msg.ByteSize())
            return
        for fd, value in msg.ListFields():
            if fd.message_type is None:
                continue
            if isinstance(value, Message):
                walk(value)
            else:  # a repeated field, or a map (whose values may be messages)
                for item in value.values() if hasattr(value, "values") else value:
                    if isinstance(item, Message):
                        walk(item)

    for event in history.events:
        walk(event)
    return sizes


@dataclass(frozen=True)
class ActivityRun:
    """One activity as the history saw it: its type, the queue it was scheduled on, the worker that ran it."""

    activity_type: str
    task_queue: str
    worker_identity: str


def activity_runs(history: WorkflowHistory) -> list[ActivityRun]:
    """Activities in schedule order, with the identity of the worker that started each (last attempt)."""
    scheduled: dict[int, tuple[str, str]] = {}
    started: dict[int, str] = {}
    for e in history.events:
        if e.HasField("activity_task_scheduled_event_attributes"):
            a = e.activity_task_scheduled_event_attributes
            scheduled[e.event_id] = (a.activity_type.name, a.task_queue.name)
        elif e.HasField("activity_task_started_event_attributes"):
            a = e.activity_task_started_event_attributes
            started[a.scheduled_event_id] = a.identity
    return [ActivityRun(t, q, started.get(eid, "")) for eid, (t, q) in sorted(scheduled.items())]
