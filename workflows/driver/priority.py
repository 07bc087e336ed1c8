"""How a generation request ranks among those waiting on an engine: a pure function of the trajectory's progress.

An engine serves waiting requests of lower priority first, ties in arrival order (vLLM's priority scheduler).
Under `fifo` every request has priority 0, so arrival order decides, as vLLM's fcfs scheduler does. Under
`turns` (progressive priority, as Heddle, arXiv 2603.28101) a request ranks by the turns its trajectory has
done: a step waits for its longest episodes, and they are not queued behind episodes just starting. Under
`predicted` (as Seer, arXiv 2511.14617) it ranks by the trajectory's predicted length in turns: its group's
first finished member's, else its task's recent mean (the training workflow's `lengths`), and never less than
the turns it has done; the long tail starts first and is never queued behind short episodes.

The same rank orders the request's activity task on its Temporal task queue (`queue_priority_key`), where it
waits when every generation worker's slots are taken: Temporal's `priority_key`, 1 (first) to 5, default 3.
The server honours it within a task-queue partition (the embedded dev server runs one per queue; a cluster
orders each of a queue's partitions on its own).
"""

from __future__ import annotations

from rollart.spec.config import PriorityPolicy

__all__ = ["MAX_TURNS_RANKED", "QUEUE_PRIORITY_KEYS", "queue_priority_key", "request_priority"]

MAX_TURNS_RANKED = 1 << 16
"""Turns past this rank alike (a bound, so a priority stays a small integer whatever max_turns is)."""


def request_priority(policy: PriorityPolicy, turns_done: int, predicted_turns: float | None = None) -> int:
    """The priority of a trajectory's next generation request (lower is served first) after `turns_done` turns;
    `predicted_turns`: its predicted length (`predicted` only; None: unknown, its turns done stand for it)."""
    if turns_done < 0:
        raise ValueError(f"turns_done must be >= 0, got {turns_done}")
    if policy == "fifo":
        return 0
    if policy == "turns":
        return -min(turns_done, MAX_TURNS_RANKED)
    if policy == "predicted":
        return -min(max(turns_done, round(predicted_turns or 0)), MAX_TURNS_RANKED)
    raise ValueError(f"unknown priority policy {policy!r}")


QUEUE_PRIORITY_KEYS = 5
"""Temporal's priority levels (`matching.priorityLevels`): keys 1 to 5, 3 when none is given."""


def queue_priority_key(rank: int) -> int | None:
    """The task-queue priority key of a request of `rank`: None (the default, 3) for rank 0, as every request has
    under `fifo`; a trajectory 1 turn in gets 2, and one 2 or more turns in gets 1, ahead of those starting."""
    if rank >= 0:
        return None
    return max(1, 3 + rank)
