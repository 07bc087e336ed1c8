"""When a job does not answer its status query: is any worker serving its workflow queue?

The training workflow watches every pool its work goes to (workflows/stalls.py), but not the queue it
runs on itself: with no control worker nothing runs it, and a status query waits for an answer that
never comes. Clients ask Temporal instead, by the same signs of life: worker heartbeats, then polls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from temporalio.client import Client, WorkflowHandle

from rollart.client.connection import is_unreachable
from rollart.infra.temporal.backlog import POLLER_FRESH_S, queue_stats
from rollart.infra.temporal.liveness import HEARTBEAT_GRACE_S, last_seen_s_ago, queue_liveness
from rollart.spec.config import TemporalConfig

__all__ = ["Unserved", "unserved"]


async def unserved(
    client: Client, handle: WorkflowHandle, heartbeat_s: float = TemporalConfig().worker_heartbeat_s
) -> str | None:
    """A line for people when no worker serves the job's workflow queue; None when one does (it is just slow)."""
    queue = (await handle.describe()).task_queue
    live, stats = await asyncio.gather(queue_liveness(client, queue, heartbeat_s), queue_stats(client, queue))
    if live is not None and live.alive:
        return None
    poll = stats.last_poll_s_ago
    fresh_s = POLLER_FRESH_S if live is None else HEARTBEAT_GRACE_S * 3  # no heartbeats: polls are all there is
    if poll is not None and poll <= fresh_s:
        return None
    seen_s_ago = last_seen_s_ago(poll, live)
    seen = "none seen" if seen_s_ago is None else f"last seen {seen_s_ago:.0f} s ago"
    return (
        f"no worker serves job {handle.id}'s workflow queue {queue!r} ({seen}): the job waits, and goes on "
        "once one starts (`rollart worker --pool control`)"
    )


@dataclass
class Unserved:
    """A follower's view of the job's own worker: says once when it is missing, once when the job answers again."""

    say: Callable[[str], None] = print
    missing: bool = False

    async def no_answer(self, client: Client, handle: WorkflowHandle) -> None:
        """The status query went unanswered on a healthy server: say why, if nobody serves the job.

        The server may go away between the health check and this question; then there is nothing to say
        (the outage is the follower's to report, on its next poll).
        """
        try:
            line = await unserved(client, handle)
        except Exception as e:
            if is_unreachable(e):
                return
            raise
        if line is not None and not self.missing:
            self.say(line)
        self.missing = line is not None

    def answered(self) -> None:
        if self.missing:
            self.say("the job answers again: a worker serves its workflow queue")
        self.missing = False
