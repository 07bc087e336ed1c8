"""The benchmarks' workload: the multi-task job (FrozenLake on h800 + arithmetic on h20) with env latency.

With `sokoban=True` GEM's Sokoban (the paper's game workload, env `gem`) joins the mix on h800 with a
latency profile of its own, `SOKOBAN_LATENCY`: a game in a sandbox that starts slowly and steps slower
than FrozenLake's.

Env latency lives in one place, `LATENCY`: a lognormal reset latency with a long
tail (median 0.2 s, p99 2 s) and a small lognormal step latency, injected into
FrozenLake's env sessions through the job's fault model (`TaskSpec.faults`, the
fault-tolerance issue's): the env runs unchanged under it, on the env worker's
thread pool, so latencies overlap as they would in remote sandboxes.

Arithmetic is single-turn (its prompts come from a throwaway env in one
`prompts` call per wave of groups): it gets no latency.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rollart.spec.config import EngineConfig, JobSpec, StoreConfig, TaskSpec, TrainingConfig
from rollart.spec.pools import Pool

__all__ = [
    "LATENCY",
    "NO_LATENCY",
    "SOKOBAN_LATENCY",
    "arithmetic_task",
    "frozenlake_task",
    "multitask_job",
    "sokoban_task",
]

LATENCY: dict[str, float] = {"reset_median_s": 0.2, "reset_p99_s": 2.0, "step_median_s": 0.01, "step_p99_s": 0.1}
"""The env latency model of every benchmark: lognormal, given by median and p99 (σ = ln(p99/median)/2.326)."""

NO_LATENCY: dict[str, float] = dict.fromkeys(LATENCY, 0.0)

SOKOBAN_LATENCY: dict[str, float] = {
    "reset_median_s": 0.5,
    "reset_p99_s": 5.0,
    "step_median_s": 0.05,
    "step_p99_s": 0.5,
}
"""Sokoban's: a remote sandbox (the paper's long-tail envs), resets 2.5x and steps 5x FrozenLake's."""

FROZENLAKE_ARGS: dict[str, Any] = {"maps": "standard", "invalid_action": "end"}
"""As in examples/multitask.yaml."""


def frozenlake_task(
    latency: dict[str, float] = LATENCY,
    pool: Pool = Pool.H800,
    max_turns: int = 8,
    env_args: dict[str, Any] | None = None,
    rollout_unit: str = "trajectory",
    group_play: str = "lockstep",
) -> TaskSpec:
    """FrozenLake (standard 4x4, groups of 8, one-token moves), env latency injected."""
    args = dict(FROZENLAKE_ARGS if env_args is None else env_args)
    common = {
        "name": "frozenlake",
        "reward": "success",
        "generate_pool": pool,
        "max_turns": max_turns,
        "group_size": 8,
        "weight": 0.5,
        "rollout_unit": rollout_unit,
        "group_play": group_play,
        "sampling": {"temperature": 1.0, "top_k": 0, "max_tokens": 1},
    }
    return TaskSpec(env="frozenlake", env_args=args, faults=_faults(latency), **common)


def sokoban_task(
    latency: dict[str, float] = SOKOBAN_LATENCY,
    pool: Pool = Pool.H800,
    max_turns: int = 10,
    rollout_unit: str = "trajectory",
    group_play: str = "lockstep",
) -> TaskSpec:
    """GEM's Sokoban as examples/sokoban.yaml plays it (one-token moves), groups of 8, its latency injected."""
    args = {
        "id": "game:Sokoban-v0-easy",
        "action_words": {"l": "left", "d": "down", "r": "right", "u": "up"},
        "action_format": "\\boxed{{{action}}}",
        "observation": "last",
        "instructions": False,
        "prompt_suffix": "\nmove:",
    }
    return TaskSpec(
        name="sokoban",
        env="gem",
        env_args=args,
        reward="env_return",
        generate_pool=pool,
        max_turns=max_turns,
        group_size=8,
        weight=0.5,
        rollout_unit=rollout_unit,
        group_play=group_play,
        faults=_faults(latency),
        sampling={"temperature": 1.0, "top_k": 0, "max_tokens": 1},
    )


def _faults(latency: dict[str, float]) -> dict[str, Any]:
    """The fault model that injects `latency` (medians and p99s of resets and steps) into a task's env."""
    return {
        "reset_latency": {"median_s": latency["reset_median_s"], "p99_s": latency["reset_p99_s"]},
        "step_latency": {"median_s": latency["step_median_s"], "p99_s": latency["step_p99_s"]},
    }


ARITHMETIC_GROUP = 8
"""examples/multitask.yaml has groups of 16; 8 here, as FrozenLake's, so that a lockstep wave (whole groups up to
the batch size) fills a batch exactly. With 16 a wave can overshoot to 72, and before the faults merge the 8 left
over went stale under bound 0 with nothing left to wake the training loop (batch mode stalled; the faults merge
fixed the wake-up)."""


def arithmetic_task(pool: Pool = Pool.H20) -> TaskSpec:
    """Single-digit addition, groups of 8 (one `generate` with n = 8 per group), otherwise as
    examples/multitask.yaml."""
    return TaskSpec(
        name="arithmetic",
        env="arithmetic",
        reward="exact_match",
        generate_pool=pool,
        max_turns=1,
        group_size=ARITHMETIC_GROUP,
        weight=0.5,
        env_args={"min_digits": 1, "max_digits": 1, "operators": "+", "num_terms": 2},
        sampling={"temperature": 1.0, "top_k": 0, "max_tokens": 1},
    )


def multitask_job(
    home: Path,
    steps: int,
    *,
    rollout_mode: str = "trajectory",
    async_bound: int = 1,
    batch_size: int = 64,
    single_pool: Pool | None = None,
    latency: dict[str, float] = LATENCY,
    rollout_unit: str = "group",
    group_play: str = "lockstep",
    sokoban: bool = False,
    placement: dict[str, str] | None = None,
    placement_every: int = 2,
) -> JobSpec:
    """examples/multitask.yaml's job on the tiny model, with env latency; `single_pool` routes every task there.

    `rollout_unit` is FrozenLake's (and Sokoban's): `group` (the default, as in examples/frozenlake.yaml: a group's
    members play in one env session, one generate_batch and one step_group per turn) or `trajectory` (an episode
    each); `group_play` how a group's members play (`lockstep` or `free`). `sokoban` adds GEM's Sokoban
    (`sokoban_task`, `SOKOBAN_LATENCY`, 10 turns): a third of the trajectories. `placement` sets tasks'
    `generate_pool` by name (`auto` included); auto tasks are re-planned every `placement_every` steps."""
    tasks = [
        frozenlake_task(latency, pool=single_pool or Pool.H800, rollout_unit=rollout_unit, group_play=group_play),
        arithmetic_task(pool=single_pool or Pool.H20),
    ]
    if sokoban:
        tasks.append(
            sokoban_task(
                SOKOBAN_LATENCY if latency is LATENCY else latency,
                pool=single_pool or Pool.H800,
                rollout_unit=rollout_unit,
                group_play=group_play,
            )
        )
    tasks = [t.model_copy(update={"generate_pool": (placement or {}).get(t.name, t.generate_pool)}) for t in tasks]
    training = TrainingConfig(
        steps=steps,
        batch_size=batch_size,
        async_bound=async_bound,
        rollout_mode=rollout_mode,
        continue_as_new_every=1000,
        placement={"every_steps": placement_every},
    )
    return JobSpec(
        name="bench",
        model_dir=home / "model",
        tasks=tasks,
        training=training,
        engine=EngineConfig(max_model_len=384 if sokoban else 256, kv_cache_gib=1),
        store=StoreConfig(path=home / "store"),
        trainer={
            "lr": 1e-3,
            "betas": (0.9, 0.99),
            "grad_clip": 1.0,
            "checkpoint_every": 1000,
            "loss": {"clip_eps": 0.2, "tis_cap": 2.0, "decoupled": True, "entropy_coef": 0.01},
        },
    )
