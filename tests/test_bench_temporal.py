"""`python -m bench temporal`'s arithmetic: the scaled limits and the actions it reads from a history."""

from __future__ import annotations

from temporalio.api.history.v1 import HistoryEvent

from bench.temporal_limits import actions_of, scaled_limits
from rollart.spec.config import TemporalLimits


def test_limits_scale_with_the_batch_as_a_paper_sized_job_meets_the_defaults() -> None:
    assert scaled_limits(512) == TemporalLimits()
    sixteenth = scaled_limits(32)
    assert (sixteenth.history_events, sixteenth.signals) == (3_200, 625)
    assert sixteenth.history_bytes == 50 * 1024 * 1024 // 16
    assert scaled_limits(1) == TemporalLimits(history_events=100, history_bytes=102_400, signals=19)


def test_actions_are_the_billed_events_and_every_retry() -> None:
    def event(kind: str, **fields: object) -> HistoryEvent:
        e = HistoryEvent()
        getattr(e, kind).SetInParent()
        for k, v in fields.items():
            setattr(getattr(e, kind), k, v)
        return e

    history = [
        event("workflow_execution_started_event_attributes"),
        event("workflow_task_scheduled_event_attributes"),  # not billed
        event("activity_task_scheduled_event_attributes"),
        event("activity_task_started_event_attributes", attempt=3),  # two retries: two more
        event("activity_task_completed_event_attributes"),  # not billed
        event("signal_external_workflow_execution_initiated_event_attributes"),
        event("timer_started_event_attributes"),
    ]
    assert actions_of(history) == 6


def test_the_simulator_prices_its_counts_as_bench_temporal_measured_them() -> None:
    """A per-episode trajectory of 7 activities and one report: 50 events in its workflow and 6 in the parent
    (bench temporal measured 50.3 and 6.1), and 7 + 2 + 2 actions; the parent's runs follow its events."""
    from rollart.simulator.temporal_load import temporal_load

    load = temporal_load(calls=7 * 100, units=100, reports=100, steps=0, elapsed_s=10.0, limits=TemporalLimits())
    assert load["temporal_events_per_s"] == (50 + 6) * 100 / 10.0
    assert load["temporal_actions_per_s"] == (7 + 2 + 2) * 100 / 10.0
    assert load["temporal_signals_per_s"] == load["temporal_units_per_s"] == 10.0
    lowered = TemporalLimits(history_events=600, continue_at=0.5)  # a run of 300 events: 600 parent events, 2 runs
    assert temporal_load(700, 100, 100, 0, 3600.0, lowered)["parent_runs_per_hour"] == 2.0
