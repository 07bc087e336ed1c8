"""Envs and rewards that misbehave on purpose, named by import path in tests (as a user's own would be)."""

from __future__ import annotations

from typing import Any

from rollart.activities.envs.base import Env, StepOutcome


class BrokenStepEnv(Env):
    """Resets fine, then raises on the first step: an env whose sandbox crashed mid-episode."""

    def __init__(self, **env_args: Any) -> None:
        super().__init__(**env_args)

    def reset(self, seed: int) -> str:
        return "AFFF\nFHFH\nFFFH\nHFFG\nmove:"

    def step(self, action: str) -> StepOutcome:
        raise RuntimeError("simulated sandbox crash")


class BigObservationEnv(Env):
    """Observations of `kib` KiB: payloads that must go to the store, not into Temporal's history."""

    def __init__(self, kib: int = 300, **env_args: Any) -> None:
        super().__init__(**env_args)
        self.kib = kib

    def reset(self, seed: int) -> str:
        return ("SFFF" * 256) * self.kib

    def step(self, action: str) -> StepOutcome:
        return StepOutcome(observation="done", reward=0.0, done=True, info={"valid": True, "success": False})
