"""Reading workflow histories in tests: every payload's size, activities with their queues and workers."""

from __future__ import annotations

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
