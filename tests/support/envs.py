"""Envs and rewards that misbehave on purpose, named by import path in tests (as a user's own would be)."""

from __future__ import annotations

import threading
from typing import Any, ClassVar

from rollart.activities.envs.faults import TransientStepFault
from rollart.spec.env import Env, StepOutcome


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


class RendezvousEnv(Env):
    """Each reset and step waits until `members` envs are in the same call at once: it passes only when a
    group's members are reset and stepped concurrently, and raises BrokenBarrierError when they are not."""

    _barriers: ClassVar[dict[int, threading.Barrier]] = {}

    def __init__(self, members: int = 2, **env_args: Any) -> None:
        super().__init__(**env_args)
        self.barrier = self._barriers.setdefault(members, threading.Barrier(members, timeout=5))

    def reset(self, seed: int) -> str:
        self.barrier.wait()
        return "ready"

    def step(self, action: str) -> StepOutcome:
        self.barrier.wait()
        return StepOutcome(observation="stepped", reward=0.0, done=False, info={"valid": True})


class FlakyStepEnv(Env):
    """Counts its steps; the i-th instance built raises a transient fault (before touching the env) on its next
    `failures[i]` steps."""

    failures: ClassVar[dict[int, int]] = {}
    instances: ClassVar[list[FlakyStepEnv]] = []

    def __init__(self, **env_args: Any) -> None:
        super().__init__(**env_args)
        self.steps = 0
        self.index = len(FlakyStepEnv.instances)
        FlakyStepEnv.instances.append(self)

    def reset(self, seed: int) -> str:
        return "ready"

    def step(self, action: str) -> StepOutcome:
        if FlakyStepEnv.failures.get(self.index, 0) > 0:
            FlakyStepEnv.failures[self.index] -= 1
            raise TransientStepFault("flaky sandbox")
        self.steps += 1
        return StepOutcome(observation=f"step {self.steps}", reward=0.0, done=False, info={"valid": True})
