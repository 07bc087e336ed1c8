"""When a run of the training workflow continues as new: before its history nears the server's limits.

Temporal terminates a workflow whose run passes `limit.historyCount.error` events (51,200 by default) or
`limit.historySize.error` bytes (50 MB), and refuses signals past `history.maximumSignalsPerExecution`
(10,000). The training workflow records a few events and a signal per trajectory, so a job of hundreds of
trajectories a step reaches them in tens of steps whatever a step count says. A run continues as new when the
server suggests it, or once its events, bytes or signals would pass `continue_at` of their limit
(`temporal.limits`) with one more step, and half again (so a run stays under that share rather than ending
just past it), or after `training.continue_as_new_every` steps if that cap is set:
whichever comes first; what the limits ask waits for the run's first second, so a burst of signals cannot make
it churn. Pure: the workflow passes what it reads from `workflow.info()` and its own count of signals.

What one more step adds is the larger of this run's average step and the last runs' (`StepCost`, carried in the
state): a run whose step came early (its batch was ready as it began) has no steps of its own to say what the
launches and reports after it will cost.

A train step is not watched while it runs, and the trajectories in flight go on reporting meanwhile. So before a
step, a run that has used half its share already counts what they will still add (`REPORT_EVENTS`,
`REPORT_BYTES` and a signal each), and continues as new first if that would take it past the share: the step is
the next run's first. This is what keeps a run with no step yet to project from (a job's first, which launches
two batches before it trains) under the share; a fresh run always takes its step.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollart.contracts.training import StepCost
from rollart.spec.config import TemporalLimits

__all__ = [
    "MIN_RUN_S",
    "REPORT_BYTES",
    "REPORT_EVENTS",
    "RUNS_REMEMBERED",
    "STEP_MARGIN",
    "RunUse",
    "largest",
    "reason",
    "remember",
]

MIN_RUN_S = 1.0
"""A run lasts at least this long (workflow time) before it continues as new."""

STEP_MARGIN = 1.5
"""The next step is taken to add this many times the run's average step: steps of one job vary by a third and
more (`python -m bench temporal`: with 1.0, runs ended up to 15 % of a limit against a share of 10 %)."""

RUNS_REMEMBERED = 4
"""How many runs' step costs a run projects from (the largest of them)."""

REPORT_EVENTS = 3
"""What a trajectory in flight still adds to the parent's history, in events: its report signal, its unit's
completion and a share of the workflow tasks they wake (`python -m bench temporal`: a trajectory costs the parent
7 to 8 events in all, its start 2 of them and a share of the workflow tasks)."""

REPORT_BYTES = 1_200
"""The same in bytes: a report signal is 0.6–0.7 KB a trajectory, a completion 0.2 KB, a workflow task's
events 0.1–0.3 KB (`python -m bench temporal`, batch 512)."""


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
    in_flight: int = 0  # trajectories started and not yet reported
    past: StepCost | None = None  # the largest step cost of the last runs (`largest`)

    def ahead(self, used: int, at_start: int, past: float) -> float:
        """What one more step may add: the larger of this run's average step and the last runs', and half again
        (steps vary); 0 before this run's first (a run takes at least one step)."""
        return STEP_MARGIN * max((used - at_start) / self.steps, past) if self.steps else 0.0

    def cost(self) -> StepCost | None:
        """This run's cost per step so far (None: it has taken none)."""
        if not self.steps:
            return None
        n = self.steps
        return StepCost(
            events=(self.events - self.start_events) / n,
            bytes=(self.bytes - self.start_bytes) / n,
            signals=self.signals / n,
        )


def remember(costs: list[StepCost], use: RunUse) -> list[StepCost]:
    """The step costs a run continues with: the last runs', this one's added if it stepped."""
    cost = use.cost()
    return [*costs, cost][-RUNS_REMEMBERED:] if cost is not None else costs


def largest(costs: list[StepCost]) -> StepCost | None:
    """Each of a step's costs at its largest over `costs` (None: no run has stepped yet)."""
    if not costs:
        return None
    return StepCost(
        events=max(c.events for c in costs),
        bytes=max(c.bytes for c in costs),
        signals=max(c.signals for c in costs),
    )


def reason(limits: TemporalLimits, cap: int | None, use: RunUse, before_step: bool = False) -> str | None:
    """Why this run should continue as new now (for the log), or None. The step cap is the user's own choice and
    applies at once; what the limits ask waits for the run's first second. `before_step`: a train step is due,
    and the reports of the trajectories in flight count too (see the module's docstring)."""
    if cap is not None and use.steps >= cap:
        return f"{use.steps} steps in this run (training.continue_as_new_every)"
    if use.seconds < MIN_RUN_S:
        return None
    share, past = limits.continue_at, use.past or StepCost()
    for what, used, at_start, limit, per_report, past_step in (
        ("history events", use.events, use.start_events, limits.history_events, REPORT_EVENTS, past.events),
        ("history bytes", use.bytes, use.start_bytes, limits.history_bytes, REPORT_BYTES, past.bytes),
        ("signals", use.signals, 0, limits.signals, 1, past.signals),
    ):
        ahead = use.ahead(used, at_start, past_step)
        if used + ahead >= share * limit:
            step = f" (+{ahead:,.0f} a step)" if ahead else ""
            return f"{what} {used:,}{step} would pass {share:.0%} of the server's {limit:,} (temporal.limits)"
        reports = use.in_flight * per_report
        if before_step and used - at_start >= share * limit / 2 and used + reports >= share * limit:
            return (
                f"{what} {used:,} (+{reports:,} from {use.in_flight:,} trajectories in flight during the step) "
                f"would pass {share:.0%} of the server's {limit:,} (temporal.limits)"
            )
    return "the server suggests it" if use.suggested else None
