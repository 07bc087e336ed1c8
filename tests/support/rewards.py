"""Rewards for tests, named by import path (as a user's own would be)."""

from __future__ import annotations

import time
from typing import Any

from rollart.contracts.activities import RewardResult, Transcript
from rollart.spec.registry import reward


def slow(transcript: Transcript) -> RewardResult:
    """Sleeps `info["sleep_s"]` of the first turn (default 2 s), then scores 1: a reward that takes a while."""
    time.sleep(float(transcript.turns[0].info.get("sleep_s", 2.0)) if transcript.turns else 2.0)
    return RewardResult(value=1.0, success=True)


class CountingModel:
    """A 'reward model' that counts how often it was loaded (per process)."""

    loaded = 0

    def __init__(self, bias: float) -> None:
        self.bias = bias

    @classmethod
    def from_args(cls, bias: float = 0.0) -> CountingModel:
        cls.loaded += 1
        time.sleep(0.2)  # loading takes a while: concurrent first calls must still load once
        return cls(bias)

    def __call__(self, transcript: Transcript) -> Any:
        return self.bias + len(transcript.turns)


@reward("beside_generation_for_test", serverless=False)
def beside_generation(transcript: Transcript) -> float:
    """Declared serverless=False: it may only run colocated with generation."""
    return 0.0
