"""Injected env latency and failures: `FaultyEnv` wraps any env with a job's `FaultModel`.

Latency is lognormal (given by median and p99: a long tail), drawn per call and
slept in the env's thread, exactly where a slow sandbox would block. A reset
failure raises from `reset` (as a broken sandbox would); a step failure raises
`TransientStepFault` *before* the wrapped env is touched, so its state is
intact and the step may be retried.
"""

from __future__ import annotations

import random
import threading
import time
import zlib

from rollart.contracts.ids import derive_seed
from rollart.spec.config import FaultModel
from rollart.spec.env import Env, StepOutcome

__all__ = ["FaultInjector", "FaultyEnv", "InjectedResetFault", "TransientStepFault"]


class InjectedResetFault(RuntimeError):
    """The fault model made this reset fail."""


class TransientStepFault(RuntimeError):
    """The fault model made this step fail before it reached the env (the env's state is unchanged)."""


class FaultInjector:
    """The draws of one worker process: seeded by the model's seed and the worker, safe across threads."""

    def __init__(self, model: FaultModel, salt: str = "") -> None:
        self.model = model
        self._rng = random.Random(derive_seed(model.seed, zlib.crc32(salt.encode())))
        self._lock = threading.Lock()

    def reset_delay(self) -> tuple[float, bool]:
        """(seconds to sleep, whether to fail) for one reset."""
        with self._lock:
            return self.model.reset_latency.draw(self._rng), self._rng.random() < self.model.reset_failure_p

    def step_delay(self) -> tuple[float, bool]:
        """(seconds to sleep, whether to fail) for one step."""
        with self._lock:
            return self.model.step_latency.draw(self._rng), self._rng.random() < self.model.step_failure_p


class FaultyEnv(Env):
    """`inner` under a fault model: latency before every reset/step, failures with the model's probabilities."""

    def __init__(self, inner: Env, injector: FaultInjector) -> None:
        super().__init__()
        self.inner = inner
        self.injector = injector

    def reset(self, seed: int) -> str:
        delay, fail = self.injector.reset_delay()
        time.sleep(delay)
        if fail:
            raise InjectedResetFault(f"injected reset failure (p={self.injector.model.reset_failure_p:g})")
        return self.inner.reset(seed)

    def step(self, action: str) -> StepOutcome:
        delay, fail = self.injector.step_delay()
        time.sleep(delay)
        if fail:
            raise TransientStepFault(f"injected step failure (p={self.injector.model.step_failure_p:g})")
        return self.inner.step(action)

    def close(self) -> None:
        self.inner.close()
