"""When a job has learned (`training.stop_when`): pure functions from each step's success to "stop now".

Why a count and not a window of successes: the count is one number carried across continue-as-new, whatever
`steps` is, and the rule it decides is simple to state: the last `steps` steps were all at or above `success`.
A step's success is `StepRecord.played_success` (the progress bar's): its batch and the groups dynamic
sampling filtered out since the step before, so a policy that solves everything is not judged on the
batch alone, which would leave its all-success groups out.
"""

from __future__ import annotations

from collections.abc import Iterable

from rollart.spec.config import StopWhen

__all__ = ["TOLERANCE", "held", "held_over", "should_stop"]

TOLERANCE = 1e-9
"""A success this close below the target counts as reaching it: 19/20 is 0.95, however the float rounds."""


def held(rule: StopWhen | None, before: int, success: float) -> int:
    """Consecutive steps at or above the rule's success after a step of `success`: `before` + 1, or 0 when the
    step fell below (or there is no rule)."""
    if rule is None or success < rule.success - TOLERANCE:
        return 0
    return before + 1


def held_over(rule: StopWhen | None, successes: Iterable[float]) -> int:
    """The count after these steps' successes, oldest first (from 0): the trailing run at or above the rule."""
    count = 0
    for success in successes:
        count = held(rule, count, success)
    return count


def should_stop(rule: StopWhen | None, held_steps: int) -> bool:
    """The job has learned: its success has held for the rule's `steps` (never without a rule)."""
    return rule is not None and held_steps >= rule.steps
