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
