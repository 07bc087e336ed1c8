"""The simulated world's latency and workload models: env sessions, rewards, token counts, the trainer.

Env latency follows bench/workload.py: lognormal by median and p99 (σ = ln(p99/median) / 2.326), per reset and
per step, plus a probability that a call fails for good (an env that breaks: the driver masks its trajectory,
`CallFailed` as Temporal reports a non-retryable `EnvBroken`). A task's episodes end after each turn with
probability `done_p` (or at the task's `max_turns`). Token counts: a first prompt, a growing context (each turn
adds its action and the next observation), and a lognormal number of output tokens per turn. Pure data and
draws from a `random.Random` the caller owns, so a run is reproducible from its seed.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from rollart.simulator.roofline import GpuSpec, ModelSpec

__all__ = ["FifoCores", "Lognormal", "Overheads", "TaskProfile", "TrainerModel"]

_Z99 = 2.326  # the standard normal's 99th percentile


@dataclass(frozen=True)
class Lognormal:
    """A latency (or count) given by its median and p99; median 0 is always 0."""

    median: float
    p99: float

    @classmethod
    def of(cls, latency: dict[str, float], kind: str) -> Lognormal:
        """From bench/workload.py's dicts: `kind` is "reset" or "step"."""
        return cls(latency[f"{kind}_median_s"], latency[f"{kind}_p99_s"])

    @property
    def sigma(self) -> float:
        return math.log(self.p99 / self.median) / _Z99 if self.median > 0 and self.p99 > self.median else 0.0

    def draw(self, rng: random.Random) -> float:
        if self.median <= 0:
            return 0.0
        return self.median * math.exp(self.sigma * rng.gauss(0.0, 1.0))

    def max_of(self, k: int, rng: random.Random) -> float:
        """The slowest of k independent draws (k calls that run side by side)."""
        return max((self.draw(rng) for _ in range(k)), default=0.0)


@dataclass(frozen=True)
class TaskProfile:
    """How one env behaves in the simulation; found by the task's `env` name."""

    env: str
    reset: Lognormal = Lognormal(0.0, 0.0)
    step: Lognormal = Lognormal(0.0, 0.0)
    reset_failure_p: float = 0.0
    step_failure_p: float = 0.0
    done_p: float = 0.25  # chance an episode ends after a turn (geometric length, capped at max_turns)
    prompt_tokens: int = 256  # the first observation, with the instructions
    obs_tokens: int = 64  # each later observation
    output: Lognormal = Lognormal(1.0, 1.0)  # tokens sampled per turn
    max_output: int = 1

    def output_tokens(self, rng: random.Random) -> int:
        return max(1, min(self.max_output, round(self.output.draw(rng))))


@dataclass(frozen=True)
class Overheads:
    """What the orchestration adds: per activity call (Temporal's schedule, poll, return: `activity_s`), per child
    workflow start (`child_s`), a reward call's own work (`reward`, on the elastic serverless pool), and the
    single-turn `prompts`/`check` calls (`light`). With `activity_cpu_s`, each call and child start also queues
    for that much CPU on `cores` cores (`FifoCores`): a machine whose orchestration saturates its CPUs (this one,
    2 cores for everything) slows every call down; a cluster's control plane has cores to spare (0)."""

    activity_s: float = 0.0
    child_s: float = 0.0
    activity_cpu_s: float = 0.0  # of which CPU on the server and the control worker, queued on `cores` (0: none)
    cores: int = 1
    reward: Lognormal = Lognormal(0.02, 0.1)
    light: Lognormal = Lognormal(0.005, 0.02)
    close_s: float = 0.001


@dataclass(frozen=True)
class TrainerModel:
    """A train step: `fixed_s` (optimizer, weight sync to the engines) plus `per_token_s` for each token trained.

    `of` derives `per_token_s` from 6 · params FLOPs per token on `gpus` GPUs at `mfu`."""

    per_token_s: float = 0.0
    fixed_s: float = 0.0
    gpus: int = 0
    gpu_name: str = field(default="")
    metrics: dict[str, float] = field(default_factory=dict)  # each step's metrics (what entropy control reads)

    @classmethod
    def of(cls, model: ModelSpec, gpu: GpuSpec, gpus: int, mfu: float = 0.4, fixed_s: float = 5.0) -> TrainerModel:
        return cls(6.0 * model.params / (gpus * gpu.flops * mfu), fixed_s, gpus, gpu.name)

    def step_s(self, tokens: int) -> float:
        return self.fixed_s + self.per_token_s * tokens


class FifoCores:
    """`k` cores serving CPU work first come, first served: how long a piece of work arriving now waits to start."""

    def __init__(self, k: int) -> None:
        self._free_at = [0.0] * max(1, k)

    def wait(self, now: float, work_s: float) -> float:
        """Book `work_s` seconds of CPU arriving at `now` on the core free first; its wait before it starts."""
        i = min(range(len(self._free_at)), key=self._free_at.__getitem__)
        start = max(now, self._free_at[i])
        self._free_at[i] = start + work_s
        return start - now
