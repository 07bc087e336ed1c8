"""When the training workflow continues as new (workflows/training/continuation.py): before any limit, not by steps."""

from __future__ import annotations

from rollart.spec.config import TemporalLimits
from rollart.workflows.training.continuation import MIN_RUN_S, RunUse, reason

DEFAULTS = TemporalLimits()


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
