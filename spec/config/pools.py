"""The rules on which pool may do what: every pool a task routes work to is declared with the role that work
needs (spec/pools.py holds the declarations and their queries).

Plain functions, called by `JobSpec`'s validator and again by `resolve`, once the envs' and rewards' own
declarations of where they run (`env_pool`, `reward_serverless`) are filled in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from rollart.spec.pools import SESSION_ROLES, PoolSpec, check_fixed_roles, pools_with_role, role_problem

if TYPE_CHECKING:
    from rollart.spec.config.task import TaskSpec

__all__ = ["check_placement_pools", "check_rewards_have_workers", "check_routes"]

AUTO = "auto"  # a task's `generate_pool: auto` (spec/config/task.py's AUTO_POOL): placed by the training workflow


def check_routes(tasks: Sequence[TaskSpec], pools: Mapping[str, PoolSpec]) -> None:
    """Each task generates on a generation pool, holds its env sessions on an env (or generation) pool and scores
    on a reward pool, all declared; control and trainer keep their roles (the workflows route to them by name)."""
    problems = check_fixed_roles(pools)
    if AUTO in pools:
        problems.append(f"pools.{AUTO}: `auto` is not a pool name (a task's `generate_pool: auto` means placed)")
    for i, t in enumerate(tasks):
        routes = [("env_pool", t.env_queue, SESSION_ROLES)]
        if t.reward is not None:  # none: an agent program's task whose run() returns its reward
            routes.append(("reward_pool", t.reward_pool, ("reward",)))
        if t.generate_pool != AUTO:
            routes.insert(0, ("generate_pool", t.generate_pool, ("generation",)))
        elif t.reward is not None and t.reward_queue == AUTO:
            routes.pop()
            problems.append(
                f"tasks.{i} ({t.name}): its reward runs beside its generation (colocated), which generate_pool: "
                "auto moves between pools; use reward_placement: serverless, or name its generate_pool"
            )
        found = [role_problem(pools, name, roles, f"tasks.{i}.{field}") for field, name, roles in routes]
        problems += [p for p in found if p]
    if problems:
        raise ValueError("; ".join(problems))


def check_placement_pools(named: Sequence[str] | None, pools: Mapping[str, PoolSpec]) -> list[str]:
    """The generation pools `generate_pool: auto` tasks may be placed on: `training.placement.pools` (each a
    declared generation pool), else every generation pool."""
    if named is None:
        found = pools_with_role(pools, "generation")
        if not found:
            raise ValueError("a task has generate_pool: auto, but the job declares no generation pool")
        return found
    problems = [
        role_problem(pools, name, ("generation",), f"training.placement.pools.{i}") for i, name in enumerate(named)
    ]
    if any(problems):
        raise ValueError("; ".join(p for p in problems if p))
    return list(dict.fromkeys(named))


def check_rewards_have_workers(tasks: Sequence[TaskSpec], pools: Mapping[str, PoolSpec]) -> None:
    """No task's reward goes to an elastic (reward) pool that may have no worker. Where a reward goes depends on
    its declaration (`@reward(serverless=...)`), so `resolve` checks this, once it has read the declarations."""
    for i, t in enumerate(tasks):
        scaling = pools.get(t.reward_queue) if t.reward is not None else None
        if scaling is not None and scaling.role == "reward" and scaling.max_workers == 0:
            raise ValueError(
                f"tasks.{i} ({t.name}) places its reward on pool {t.reward_queue!r}, but pools.{t.reward_queue}"
                f".max_workers is 0, so no worker would ever run it; raise max_workers or set "
                "reward_placement: colocated"
            )
