"""`training.stop_when`: the pure rule that ends a job once its success has held, and how its end is said."""

from __future__ import annotations

import pytest

from rollart.contracts.training import TrainingResult
from rollart.spec.config import StopWhen
from rollart.workflows.stopping import held, held_over, should_stop

RULE = StopWhen(success=0.95, steps=3)


def stops(rule: StopWhen | None, successes: list[float]) -> bool:
    return should_stop(rule, held_over(rule, successes))


def first_stop(rule: StopWhen | None, successes: list[float]) -> int | None:
    """The number of steps after which the loop ends (what `ended at step N` says), None if it never does."""
    count = 0
    for n, success in enumerate(successes, start=1):
        count = held(rule, count, success)
        if should_stop(rule, count):
            return n
    return None


def test_holding_exactly_the_rules_steps_stops() -> None:
    assert stops(RULE, [0.95, 0.97, 1.0])
    assert first_stop(RULE, [0.2, 0.5, 0.95, 0.97, 1.0, 1.0]) == 5


def test_not_enough_steps_yet() -> None:
    assert not stops(RULE, [])
    assert not stops(RULE, [1.0])
    assert not stops(RULE, [1.0, 1.0])
    assert first_stop(RULE, [1.0, 1.0]) is None


def test_a_dip_starts_the_count_again() -> None:
    assert not stops(RULE, [1.0, 1.0, 0.94])
    assert not stops(RULE, [1.0, 1.0, 0.5, 1.0, 1.0])
    assert held_over(RULE, [1.0, 1.0, 0.5, 1.0, 1.0]) == 2
    assert first_stop(RULE, [1.0, 1.0, 0.5, 1.0, 1.0, 1.0]) == 6


def test_at_the_target_counts_and_below_it_does_not() -> None:
    assert held(RULE, 4, 0.95) == 5
    assert held(RULE, 4, 19 / 20) == 5  # 95 % of 20 episodes, as the workflow divides it
    assert held(RULE, 4, 61 / 64) == 5
    assert held(RULE, 4, 60 / 64) == 0  # 0.9375
    assert held(StopWhen(success=1.0, steps=1), 0, 1.0) == 1


def test_the_count_goes_on_past_the_rule() -> None:
    assert held_over(RULE, [1.0] * 7) == 7 and stops(RULE, [1.0] * 7)


def test_no_rule_never_stops() -> None:
    assert held(None, 5, 1.0) == 0
    assert held_over(None, [1.0] * 100) == 0
    assert not should_stop(None, 1_000)
    assert first_stop(None, [1.0] * 100) is None


def test_one_step_rule_stops_at_the_first_step_at_the_target() -> None:
    rule = StopWhen(success=0.5, steps=1)
    assert first_stop(rule, [0.1, 0.4, 0.5, 0.1]) == 3


def ended(steps: int, **fields: object) -> TrainingResult:
    """A result of `steps` steps (its ledger is not what these tests are about)."""
    ledger = {"started": 0, "trained": 0, "dropped": 0, "failed": 0, "cancelled_in_flight": 0, "buffered_unused": 0}
    return TrainingResult(job_id="j", steps=steps, version=steps, **ledger, **fields)


@pytest.mark.parametrize(
    ("result", "line"),
    [
        (
            ended(96, ended_by="stop_when", max_steps=200, stop_when=StopWhen(success=0.95, steps=20)),
            "learned: success ≥ 0.95 held for 20 steps, ended at step 96 of 200",
        ),
        (ended(7, ended_by="stop_signal", max_steps=200), "stopped by its stop signal at step 7 of 200"),
        (
            ended(200, max_steps=200, stop_when=StopWhen(success=0.95, steps=1)),
            "trained all 200 steps; stop_when (success ≥ 0.95 held for 1 step) did not end it earlier",
        ),
    ],
)
def test_the_result_says_why_the_job_ended(result: TrainingResult, line: str) -> None:
    assert result.describe_end() == line
    assert result.end_note() == line


def test_a_plain_run_to_its_steps_has_nothing_more_to_say() -> None:
    result = ended(3)
    assert result.ended_by == "steps" and result.end_note() is None
    assert result.describe_end() == "trained all 3 steps"


def test_a_run_that_did_not_learn_says_so_with_its_best_step(tmp_path) -> None:
    from rollart.client.train import not_learned_note

    rows = [{"step": 0, "success_rate": 0.0}, {"step": 1, "success_rate": 0.5}, {"step": 2, "success_rate": 0.25}]
    result = ended(3, max_steps=3, stop_when=StopWhen(success=0.95, steps=20))
    note = not_learned_note(result, rows, tmp_path)
    assert note is not None and note.startswith("not learned in 3 steps (stop_when: success ≥ 0.95 held for 20 steps)")
    assert "success 0.25 at the end, best 0.50 (step 1)" in note and f"rollart report {tmp_path}" in note
    # dynamic sampling's played success is the step's success, not the batch's
    played = [{"step": 0, "success_rate": 0.1, "success_sampled": 0.9}]
    assert "best 0.90 (step 0)" in (not_learned_note(result, played, tmp_path) or "")


def test_a_run_that_learned_or_has_no_rule_gets_no_warning(tmp_path) -> None:
    from rollart.client.train import not_learned_note

    rows = [{"step": 0, "success_rate": 1.0}]
    rule = StopWhen(success=0.95, steps=1)
    assert not_learned_note(ended(1, ended_by="stop_when", stop_when=rule), rows, tmp_path) is None
    assert not_learned_note(ended(1, ended_by="stop_signal", stop_when=rule), rows, tmp_path) is None
    assert not_learned_note(ended(1), rows, tmp_path) is None
    assert not_learned_note(ended(1, stop_when=rule), [], tmp_path) is None
