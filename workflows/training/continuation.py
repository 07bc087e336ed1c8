"""When a run of the training workflow continues as new: before its history nears the server's limits.

Temporal terminates a workflow whose run passes `limit.historyCount.error` events (51,200 by default) or
`limit.historySize.error` bytes (50 MB), and refuses signals past `history.maximumSignalsPerExecution`
(10,000). The training workflow records a few events and a signal per trajectory, so a job of hundreds of
trajectories a step reaches them in tens of steps whatever a step count says. A run continues as new when the
server suggests it, or once its events, bytes or signals would pass `continue_at` of their limit
(`temporal.limits`) with one more step like the run's steps so far, and half again (so a run stays under that
share rather than ending just past it), or after `training.continue_as_new_every` steps if that cap is set:
whichever comes first; what the limits ask waits for the run's first second, so a burst of signals cannot make
it churn. Pure: the workflow passes what it reads from `workflow.info()` and its own count of signals.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollart.spec.config import TemporalLimits

__all__ = ["MIN_RUN_S", "STEP_MARGIN", "RunUse", "reason"]

MIN_RUN_S = 1.0
"""A run lasts at least this long (workflow time) before it continues as new."""

STEP_MARGIN = 1.5
"""The next step is taken to add this many times the run's average step: steps of one job vary by a third and
more (`python -m bench temporal`: with 1.0, runs ended up to 15 % of a limit against a share of 10 %)."""


@dataclass(frozen=True)
class RunUse:
    """What this run of the workflow has used so far."""

    events: int
    bytes: int
    signals: int
    suggested: bool  # the server's `continue_as_new_suggested`
    steps: int  # train steps in this run
    seconds: float  # workflow time since the run started
    start_events: int = 0  # the history as the run started (its first event carries the state it continued with)
    start_bytes: int = 0

    def ahead(self, used: int, at_start: int) -> float:
        """What one more step may add: this run's average step and half again (steps vary; 0 before the first)."""
        return STEP_MARGIN * (used - at_start) / self.steps if self.steps else 0.0


def reason(limits: TemporalLimits, cap: int | None, use: RunUse) -> str | None:
    """Why this run should continue as new now (for the log), or None. The step cap is the user's own choice and
    applies at once; what the limits ask waits for the run's first second."""
    if cap is not None and use.steps >= cap:
        return f"{use.steps} steps in this run (training.continue_as_new_every)"
    if use.seconds < MIN_RUN_S:
        return None
    share = limits.continue_at
    for what, used, at_start, limit in (
        ("history events", use.events, use.start_events, limits.history_events),
        ("history bytes", use.bytes, use.start_bytes, limits.history_bytes),
        ("signals", use.signals, 0, limits.signals),
    ):
        ahead = use.ahead(used, at_start)
        if used + ahead >= share * limit:
            step = f" (+{ahead:,.0f} a step)" if ahead else ""
            return f"{what} {used:,}{step} would pass {share:.0%} of the server's {limit:,} (temporal.limits)"
    return "the server suggests it" if use.suggested else None
