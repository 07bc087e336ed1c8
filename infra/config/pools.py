"""The rules on which pool may do what: every pool a task routes work to is declared with the role that work
needs (infra/pools.py holds the declarations and their queries).

Plain functions, called by `JobSpec`'s validator and again by `resolve`, once the envs' and rewards' own
declarations of where they run (`env_pool`, `reward_serverless`) are filled in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from rollart.infra.pools import SESSION_ROLES, PoolSpec, check_fixed_roles, role_problem

if TYPE_CHECKING:
    from rollart.infra.config.task import TaskSpec

__all__ = ["check_rewards_have_workers", "check_routes"]


def check_routes(tasks: Sequence[TaskSpec], pools: Mapping[str, PoolSpec]) -> None:
    """Each task generates on a generation pool, holds its env sessions on an env (or generation) pool and scores
    on a reward pool, all declared; control and trainer keep their roles (the workflows route to them by name)."""
    problems = check_fixed_roles(pools)
    for i, t in enumerate(tasks):
        routes = [
            ("generate_pool", t.generate_pool, ("generation",)),
            ("env_pool", t.env_queue, SESSION_ROLES),
            ("reward_pool", t.reward_pool, ("reward",)),
        ]
        found = [role_problem(pools, name, roles, f"tasks.{i}.{field}") for field, name, roles in routes]
        problems += [p for p in found if p]
    if problems:
        raise ValueError("; ".join(problems))


def check_rewards_have_workers(tasks: Sequence[TaskSpec], pools: Mapping[str, PoolSpec]) -> None:
    """No task's reward goes to an elastic (reward) pool that may have no worker. Where a reward goes depends on
    its declaration (`@reward(serverless=...)`), so `resolve` checks this, once it has read the declarations."""
    for i, t in enumerate(tasks):
        scaling = pools.get(t.reward_queue)
        if scaling is not None and scaling.role == "reward" and scaling.max_workers == 0:
            raise ValueError(
                f"tasks.{i} ({t.name}) places its reward on pool {t.reward_queue!r}, but pools.{t.reward_queue}"
                f".max_workers is 0, so no worker would ever run it; raise max_workers or set "
                "reward_placement: colocated"
            )
