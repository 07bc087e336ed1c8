"""What a simulated run would ask of Temporal: events, actions and signals per second, and the training
workflow's history, from the calls, units and reports the run made.

Each count is priced with what `python -m bench temporal` measured in real histories (docs/benchmarks.md,
temporal), for a per-episode trajectory of 7 activities and one report: its workflow recorded 50 events (6 an
activity: scheduled, started, completed and the workflow task that follows; 8 its own: start, first and last
workflow tasks, the report sent, the end), the training workflow 6 (3 the unit: its start initiated, started and
completed; 3 a report: the signal and the workflow task it wakes). Actions are counted as Temporal Cloud bills
them: each activity, a unit's start twice (the parent's command and the child's start), each report twice (sent
and taken), and each train step; heartbeats are left out (a generate beats once every 20 s past its first 20 s).
Estimates for sizing a cluster or a namespace, not measurements: group units record fewer events per
trajectory than these prices give.
"""

from __future__ import annotations

from rollart.spec.config import TemporalLimits

__all__ = ["EVENTS_PER_ACTIVITY", "temporal_load"]

EVENTS_PER_ACTIVITY = 6
EVENTS_PER_UNIT = 8
PARENT_EVENTS_PER_UNIT = 3
PARENT_EVENTS_PER_REPORT = 3
PARENT_EVENTS_PER_STEP = 6  # the train step activity and its workflow task, a search-attribute upsert


def temporal_load(
    calls: int, units: int, reports: int, steps: int, elapsed_s: float, limits: TemporalLimits
) -> dict[str, float]:
    """Per second of the run: events, actions, signals, units started; and the training workflow's events per
    step and how many runs an hour it continues into (at `limits.continue_at` of the event limit)."""
    elapsed = elapsed_s or 1e-9
    parent = PARENT_EVENTS_PER_UNIT * units + PARENT_EVENTS_PER_REPORT * reports + PARENT_EVENTS_PER_STEP * steps
    events = EVENTS_PER_ACTIVITY * calls + EVENTS_PER_UNIT * units + parent
    actions = calls + 2 * units + 2 * reports + steps
    return {
        "temporal_events_per_s": events / elapsed,
        "temporal_actions_per_s": actions / elapsed,
        "temporal_signals_per_s": reports / elapsed,
        "temporal_units_per_s": units / elapsed,
        "parent_events_per_step": parent / steps if steps else float("nan"),
        "parent_runs_per_hour": parent / (limits.continue_at * limits.history_events) * 3600.0 / elapsed,
    }
