"""How a generation request ranks among those waiting on an engine: a pure function of the trajectory's progress.

An engine serves waiting requests of lower priority first, ties in arrival order (vLLM's priority scheduler).
Under `fifo` every request has priority 0, so arrival order decides, as vLLM's fcfs scheduler does. Under
`turns` (progressive priority, as Heddle, arXiv 2603.28101) a request ranks by the turns its trajectory has
done: a step waits for its longest episodes, and they are not queued behind episodes just starting.
"""

from __future__ import annotations

from rollart.infra.config import PriorityPolicy

__all__ = ["MAX_TURNS_RANKED", "request_priority"]

MAX_TURNS_RANKED = 1 << 16
"""Turns past this rank alike (a bound, so a priority stays a small integer whatever max_turns is)."""


def request_priority(policy: PriorityPolicy, turns_done: int) -> int:
    """The priority of a trajectory's next generation request (lower is served first) after `turns_done` turns."""
    if turns_done < 0:
        raise ValueError(f"turns_done must be >= 0, got {turns_done}")
    if policy == "fifo":
        return 0
    if policy == "turns":
        return -min(turns_done, MAX_TURNS_RANKED)
    raise ValueError(f"unknown priority policy {policy!r}")
