"""Automatic affinity in simulation: what spec/placement.py (`rollart plan`) chooses for the paper-like setup,
from the same task profiles and GPU peaks the simulator plays, and how the choice fares against the
hand-written placements when simulated.

The profile is the planner's input a run would record (`task_tokens`): each task's trajectories per step and,
per trajectory, uncached prompt tokens (the first prompt, then each later observation) and decode tokens
(expected turns x the mean tokens sampled per turn), computed from the simulator's `TaskProfile`s. The rates
are spec/hardware.py's rooflines for the setup's model on each pool's tensor-parallel engines.
"""

from __future__ import annotations

import random
import statistics

from bench.simulate.setups import PAPER_POOLS, PAPER_PROFILES, paper
from rollart.simulator.models import TaskProfile
from rollart.simulator.roofline import MODELS
from rollart.spec.hardware import engine_rates
from rollart.spec.placement import Placement, PoolRates, TaskLoad, evaluate, plan

__all__ = ["HAND_WRITTEN", "loads", "planned", "rates"]

HAND_WRITTEN = {
    "declared": {"frozenlake": "h800", "sokoban": "h800", "arithmetic": "h20"},
    "swapped": {"frozenlake": "h20", "sokoban": "h20", "arithmetic": "h800"},
}
"""The placements written by hand: as the tasks declare (multi-turn on h800, the long answers on h20), and the
other way round."""

PRODUCTS = {"h800": "NVIDIA-H800", "h20": "NVIDIA-H20"}


def _expected_turns(profile: TaskProfile, max_turns: int) -> float:
    """A geometric episode length (ends after a turn with `done_p`), capped at `max_turns`."""
    return sum((1 - profile.done_p) ** k for k in range(max_turns))


def loads(scale: float) -> list[TaskLoad]:
    """Each task's work per step in the paper-like setup at `scale`, as a run's `task_tokens` would show it."""
    setup = paper("trajectory", 1, scale=scale)
    rng = random.Random(0)
    weights = sum(t.weight for t in setup.plan.tasks)
    out = []
    for task in setup.plan.tasks:
        profile = PAPER_PROFILES[task.env]
        turns = _expected_turns(profile, task.max_turns)
        mean_output = statistics.fmean(profile.output_tokens(rng) for _ in range(20_000))
        out.append(
            TaskLoad(
                task=task.name,
                trajectories=setup.plan.training.batch_size * task.weight / weights,
                uncached_prompt_tokens=profile.prompt_tokens + (turns - 1) * profile.obs_tokens,
                decode_tokens=turns * mean_output,
            )
        )
    return out


def rates(scale: float, model: str = "32b") -> list[PoolRates]:
    """Each generation pool's engines at `scale` and their roofline rates for the setup's model."""
    spec = MODELS[model]
    out = []
    for pool in PAPER_POOLS:
        engines = max(1, int(pool.gpus * scale) // pool.tp)
        r = engine_rates(PRODUCTS[pool.name], spec.params, gpus=pool.tp, kv_bytes_per_token=spec.kv_bytes_per_token)
        out.append(PoolRates(pool.name, engines, r.prefill_tokens_per_s, r.decode_tokens_per_s))
    return out


def planned(scale: float) -> tuple[Placement, dict[str, Placement]]:
    """The planner's choice and each hand-written placement, as the planner's model scores them."""
    task_loads, pool_rates = loads(scale), rates(scale)
    hand = {name: evaluate(a, task_loads, pool_rates) for name, a in HAND_WRITTEN.items()}
    return plan(task_loads, pool_rates), hand
