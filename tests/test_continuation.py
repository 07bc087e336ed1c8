"""When the training workflow continues as new (workflows/training/continuation.py): before any limit, not by steps."""

from __future__ import annotations

from rollart.contracts.training import StepCost
from rollart.spec.config import TemporalLimits
from rollart.workflows.training.continuation import MIN_RUN_S, RUNS_REMEMBERED, RunUse, largest, reason, remember

DEFAULTS = TemporalLimits(continue_at=0.1)  # Temporal's default limits, continuing at 10 % (round numbers)


def use(**kw: object) -> RunUse:
    base = {"events": 100, "bytes": 10_000, "signals": 10, "suggested": False, "steps": 1, "seconds": 60.0}
    return RunUse(**{**base, **kw})  # type: ignore[arg-type]


def test_a_small_run_goes_on() -> None:
    assert reason(DEFAULTS, None, use()) is None


def test_each_limit_at_its_share_continues_it_with_the_reason() -> None:
    """Before a first step (nothing to project from) a run continues at the share itself."""
    assert "history events 5,120" in (reason(DEFAULTS, None, use(events=5_120, steps=0)) or "")  # 10 % of 51,200
    assert reason(DEFAULTS, None, use(events=5_119, steps=0)) is None
    assert "history bytes" in (reason(DEFAULTS, None, use(bytes=int(0.1 * 50 * 1024 * 1024) + 1, steps=0)) or "")
    assert "signals 1,000" in (reason(DEFAULTS, None, use(signals=1_000, steps=0)) or "")  # the report signals
    lowered = TemporalLimits(history_events=1_000, continue_at=0.5)  # a namespace configured lower
    assert reason(lowered, None, use(events=500, steps=0)) is not None
    assert reason(lowered, None, use(events=499, steps=0)) is None


def test_a_run_continues_before_another_step_would_take_it_past_the_share() -> None:
    """After steps, what one more would add (the run's average, its carried start left out) counts: a run ends
    under the share, not just past it."""
    assert reason(DEFAULTS, None, use(events=2_100, steps=1)) is not None  # 2,100 + 1.5 × 2,100 ≥ 5,120
    assert reason(DEFAULTS, None, use(events=2_000, steps=1)) is None
    assert reason(DEFAULTS, None, use(events=4_000, steps=8)) is None  # 4,000 + 1.5 × 500 < 5,120
    why = reason(DEFAULTS, None, use(events=4_200, steps=4)) or ""
    assert "history events 4,200 (+1,575 a step) would pass 10% of the server" in why
    # the state the run continued with is in its first event: not a step's growth
    big_start = use(bytes=4_000_000, start_bytes=3_500_000, steps=1)
    assert reason(DEFAULTS, None, big_start) is None  # 4,000,000 + 1.5 × 500,000 < 5,242,880


def test_the_server_suggesting_it_is_enough() -> None:
    assert reason(DEFAULTS, None, use(suggested=True)) == "the server suggests it"


def test_the_step_count_is_only_a_cap() -> None:
    assert reason(DEFAULTS, 20, use(steps=19)) is None
    assert "20 steps" in (reason(DEFAULTS, 20, use(steps=20)) or "")
    assert reason(DEFAULTS, None, use(steps=10_000)) is None  # no cap: the history decides


def test_the_limits_wait_for_the_first_second_the_cap_does_not() -> None:
    young = MIN_RUN_S / 2
    assert reason(DEFAULTS, None, use(events=60_000, suggested=True, seconds=young)) is None
    assert reason(DEFAULTS, 1, use(steps=1, seconds=young)) is not None


def test_before_a_step_the_reports_still_in_flight_count() -> None:
    """A step is not watched while it runs, and the trajectories in flight report meanwhile: a run that has used
    half its share continues before a step that their reports would take past it (a job's first run launches two
    batches before it has a step to project from); a fresh run always takes its step."""
    first_run = use(events=4_000, steps=0, in_flight=512)  # 4,000 + 3 × 512 ≥ 5,120
    assert reason(DEFAULTS, None, first_run) is None  # while it waits, nothing is due yet
    why = reason(DEFAULTS, None, first_run, before_step=True) or ""
    assert "history events 4,000 (+1,536 from 512 trajectories in flight during the step)" in why
    assert reason(DEFAULTS, None, use(events=4_000, steps=0, in_flight=300), before_step=True) is None
    fresh = use(events=400, start_events=200, steps=0, in_flight=5_000)  # reports alone pass it: step anyway
    assert reason(DEFAULTS, None, fresh, before_step=True) is None
    signals = use(signals=600, steps=0, in_flight=512)
    assert "signals 600 (+512 from 512" in (reason(DEFAULTS, None, signals, before_step=True) or "")


def test_a_run_whose_step_came_early_projects_from_the_runs_before() -> None:
    """A run whose batch was ready as it began steps at once, with nothing of its own to say what the launches and
    reports after the step will cost: the last runs' step costs say it, the largest of them."""
    early = use(events=230, start_events=200, steps=1)  # 30 events of its own so far
    assert reason(DEFAULTS, None, early) is None
    costs: list[StepCost] = []
    for events in (3_000, 4_000, 2_500):
        costs = remember(costs, use(events=200 + events, start_events=200, steps=1))
    assert [c.events for c in costs] == [3_000, 4_000, 2_500]
    past = largest(costs)
    assert past is not None and past.events == 4_000
    why = reason(DEFAULTS, None, use(events=230, start_events=200, steps=1, past=past)) or ""
    assert "history events 230 (+6,000 a step)" in why  # 1.5 × the largest, not × its own 30
    # a run that has not stepped is not remembered, and only the last few are
    assert remember(costs, use(steps=0)) == costs
    for _ in range(RUNS_REMEMBERED):
        costs = remember(costs, use(events=300, start_events=200, steps=1))
    assert len(costs) == RUNS_REMEMBERED and largest(costs) == StepCost(events=100, bytes=10_000, signals=10)
    # before its own first step, a run projects nothing from them: it takes at least one step
    assert reason(DEFAULTS, None, use(events=4_000, steps=0, past=past)) is None
