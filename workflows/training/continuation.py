"""When a run of the training workflow continues as new: before its history nears the server's limits.

Temporal terminates a workflow whose run passes `limit.historyCount.error` events (51,200 by default) or
`limit.historySize.error` bytes (50 MB), and refuses signals past `history.maximumSignalsPerExecution`
(10,000). The training workflow records a few events and a signal per trajectory, so a job of hundreds of
trajectories a step reaches them in tens of steps whatever a step count says. A run continues as new when the
server suggests it, or once its events, bytes or signals reach `continue_at` of their limit (`temporal.limits`),
or after `training.continue_as_new_every` steps if that cap is set: whichever comes first; what the limits ask
waits for the run's first second, so a burst of signals cannot make it churn. Pure: the workflow passes what it reads
from `workflow.info()` and its own count of signals.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollart.spec.config import TemporalLimits

__all__ = ["MIN_RUN_S", "RunUse", "reason"]

MIN_RUN_S = 1.0
"""A run lasts at least this long (workflow time) before it continues as new."""


@dataclass(frozen=True)
class RunUse:
    """What this run of the workflow has used so far."""

    events: int
    bytes: int
    signals: int
    suggested: bool  # the server's `continue_as_new_suggested`
    steps: int  # train steps in this run
    seconds: float  # workflow time since the run started


def reason(limits: TemporalLimits, cap: int | None, use: RunUse) -> str | None:
    """Why this run should continue as new now (for the log), or None. The step cap is the user's own choice and
    applies at once; what the limits ask waits for the run's first second."""
    if cap is not None and use.steps >= cap:
        return f"{use.steps} steps in this run (training.continue_as_new_every)"
    if use.seconds < MIN_RUN_S:
        return None
    share = limits.continue_at
    for what, used, limit in (
        ("history events", use.events, limits.history_events),
        ("history bytes", use.bytes, limits.history_bytes),
        ("signals", use.signals, limits.signals),
    ):
        if used >= share * limit:
            return f"{what} {used:,} ≥ {share:.0%} of the server's {limit:,} (temporal.limits)"
    return "the server suggests it" if use.suggested else None
