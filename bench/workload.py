"""The benchmarks' workload: the multi-task job (FrozenLake on h800 + arithmetic on h20) with env latency.

Env latency lives in one place, `LATENCY`: a lognormal reset latency with a long
tail (median 0.2 s, p99 2 s) and a small lognormal step latency, on FrozenLake's
env sessions. How it is injected:

- when the job spec has the fault model of the fault-tolerance issue
  (`TaskSpec.faults`), through it — the env runs unchanged under the model;
- otherwise through `SlowFrozenLake`, this bench's own stand-in: FrozenLake
  that sleeps a lognormal latency before each reset and step. It is only the
  bench's, to be replaced by the fault model once that lands (`USE_FAULT_MODEL`).

Arithmetic is single-turn (its prompts come from a throwaway env in one
`prompts` call per wave of groups): it gets no latency.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rollart.activities.envs.base import StepOutcome
from rollart.activities.envs.frozenlake import FrozenLake
from rollart.infra.config import EngineConfig, JobSpec, StoreConfig, TaskSpec, TrainingConfig
from rollart.infra.pools import Pool
from rollart.infra.registry import env

__all__ = ["LATENCY", "NO_LATENCY", "SlowFrozenLake", "USE_FAULT_MODEL", "frozenlake_task", "multitask_job"]

LATENCY: dict[str, float] = {"reset_median_s": 0.2, "reset_p99_s": 2.0, "step_median_s": 0.01, "step_p99_s": 0.1}
"""The env latency model of every benchmark: lognormal, given by median and p99 (σ = ln(p99/median)/2.326)."""

NO_LATENCY: dict[str, float] = {k: 0.0 for k in LATENCY}

USE_FAULT_MODEL: bool = "faults" in TaskSpec.model_fields
"""Inject latency through the job's fault model when the job spec has one; else through SlowFrozenLake."""

_Z99 = 2.3263478740408408  # the standard normal's 0.99 quantile
_rng = random.Random(0)
_widened: set[int] = set()


def lognormal(median_s: float, p99_s: float, rng: random.Random = _rng) -> float:
    """A draw from the lognormal with this median and 99th percentile (0 when the median is 0)."""
    if median_s <= 0:
        return 0.0
    sigma = math.log(max(p99_s, median_s) / median_s) / _Z99
    return rng.lognormvariate(math.log(median_s), sigma)


def _widen_default_executor() -> None:
    """Env calls run in the event loop's default executor (min(32, cores + 4) threads: 6 here); sleeping
    envs would queue behind each other there. Give the worker's loop a wide pool once, as the fault
    model's own env thread pool does, so latency overlaps as it would in remote sandboxes."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return  # built outside a worker (a job check): nothing to widen
    if id(loop) not in _widened:
        _widened.add(id(loop))
        loop.set_default_executor(ThreadPoolExecutor(max_workers=256, thread_name_prefix="bench-env"))


@env("bench_slow_frozenlake", reset_timeout=60, step_timeout=30)
class SlowFrozenLake(FrozenLake):
    """FrozenLake behind a lognormal reset and step latency (the bench's stand-in for the fault model)."""

    def __init__(self, *, reset_median_s: float = 0.0, reset_p99_s: float = 0.0, step_median_s: float = 0.0,
                 step_p99_s: float = 0.0, **frozenlake_args: Any) -> None:  # fmt: skip
        super().__init__(**frozenlake_args)
        self.latency = (reset_median_s, reset_p99_s, step_median_s, step_p99_s)
        _widen_default_executor()

    def reset(self, seed: int) -> str:
        time.sleep(lognormal(self.latency[0], self.latency[1]))
        return super().reset(seed)

    def step(self, action: str) -> StepOutcome:
        time.sleep(lognormal(self.latency[2], self.latency[3]))
        return super().step(action)


FROZENLAKE_ARGS: dict[str, Any] = {"maps": "standard", "invalid_action": "end"}
"""As in examples/multitask.yaml."""


def frozenlake_task(latency: dict[str, float] = LATENCY, pool: Pool = Pool.H800, max_turns: int = 8,
                    env_args: dict[str, Any] | None = None, rollout_unit: str = "trajectory") -> TaskSpec:  # fmt: skip
    """FrozenLake (standard 4x4, groups of 8, one-token moves), env latency injected."""
    args = dict(FROZENLAKE_ARGS if env_args is None else env_args)
    common = dict(name="frozenlake", reward="success", generate_pool=pool, max_turns=max_turns, group_size=8,
                  weight=0.5, rollout_unit=rollout_unit,
                  sampling={"temperature": 1.0, "top_k": 0, "max_tokens": 1})  # fmt: skip
    if USE_FAULT_MODEL:
        faults = {"reset_latency": {"median_s": latency["reset_median_s"], "p99_s": latency["reset_p99_s"]},
                  "step_latency": {"median_s": latency["step_median_s"], "p99_s": latency["step_p99_s"]}}  # fmt: skip
        return TaskSpec(env="frozenlake", env_args=args, faults=faults, **common)
    return TaskSpec(env="bench.workload:SlowFrozenLake", env_args={**args, **latency}, **common)


ARITHMETIC_GROUP = 8
"""examples/multitask.yaml has groups of 16; 8 here, as FrozenLake's, so that a lockstep wave (whole groups up to
the batch size) fills a batch exactly. With 16 a wave can overshoot to 72, and before the faults merge the 8 left over went
stale under bound 0 with nothing left to wake the training loop (batch mode stalled; the faults merge fixed the wake-up)."""


def arithmetic_task(pool: Pool = Pool.H20) -> TaskSpec:
    """Single-digit addition, groups of 8 (one `generate` with n = 8 per group), otherwise as examples/multitask.yaml."""
    return TaskSpec(name="arithmetic", env="arithmetic", reward="exact_match", generate_pool=pool, max_turns=1,
                    group_size=ARITHMETIC_GROUP, weight=0.5,
                    env_args={"min_digits": 1, "max_digits": 1, "operators": "+", "num_terms": 2},
                    sampling={"temperature": 1.0, "top_k": 0, "max_tokens": 1})  # fmt: skip


def multitask_job(home: Path, steps: int, *, rollout_mode: str = "trajectory", async_bound: int = 1,
                  batch_size: int = 64, single_pool: Pool | None = None, latency: dict[str, float] = LATENCY,
                  rollout_unit: str = "group") -> JobSpec:  # fmt: skip
    """examples/multitask.yaml's job on the tiny model, with env latency; `single_pool` routes both tasks there.

    `rollout_unit` is FrozenLake's: `group` (the default, as in examples/frozenlake.yaml: a group's members play
    in one env session, one generate_batch and one step_group per turn) or `trajectory` (an episode each)."""
    tasks = [frozenlake_task(latency, pool=single_pool or Pool.H800, rollout_unit=rollout_unit),
             arithmetic_task(pool=single_pool or Pool.H20)]
    training = TrainingConfig(steps=steps, batch_size=batch_size, async_bound=async_bound,
                              rollout_mode=rollout_mode, continue_as_new_every=1000)  # fmt: skip
    return JobSpec(name="bench", model_dir=home / "model", tasks=tasks, training=training,
                   engine=EngineConfig(max_model_len=256, kv_cache_gib=1), store=StoreConfig(path=home / "store"),
                   trainer={"lr": 1e-3, "betas": (0.9, 0.99), "grad_clip": 1.0, "checkpoint_every": 1000,
                            "loss": {"clip_eps": 0.2, "tis_cap": 2.0, "decoupled": True, "entropy_coef": 0.01}})  # fmt: skip
