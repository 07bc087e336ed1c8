"""The job's `pools` section (how the elastic pools scale) and the rules on which pool may do what.

The rules are plain functions, called by the models that hold a pool (`TaskSpec`, `JobSpec`) and by `resolve`
(a reward placed by its declaration on a pool without workers).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydantic import Field, model_validator

from rollart.infra.config.base import Section
from rollart.infra.pools import ENV_POOLS, GENERATION_POOLS, Pool

if TYPE_CHECKING:
    from rollart.infra.config.task import TaskSpec

__all__ = [
    "ELASTIC_POOLS",
    "ElasticPoolConfig",
    "check_generation_pool",
    "check_rewards_have_workers",
    "check_session_pool",
    "default_pools",
    "known_elastic_pools",
]

ELASTIC_POOLS: tuple[Pool, ...] = (Pool.SERVERLESS,)
"""Pools whose workers are stateless and may be started and stopped with their backlog."""


class ElasticPoolConfig(Section):
    """How an elastic pool's workers scale with its queue's backlog (the local autoscaler, `rollart autoscale`).

    A worker takes at most `max_concurrent_activities` at once, so work beyond what the
    workers hold waits in the queue, where Temporal counts it: the backlog. The target is
    `workers + ceil(backlog / backlog_per_worker)` while there is a backlog, kept while work
    still arrives, and `min_workers` once the queue is idle, within [min_workers, max_workers].
    Scale-up waits `scale_up_cooldown_s` after the last one (the backlog count refreshes every
    ~5 s); scale-down happens only when every target seen in the last `scale_down_cooldown_s`
    was lower (no flapping).
    """

    min_workers: int = Field(1, ge=0)
    max_workers: int = Field(4, ge=0)
    max_concurrent_activities: int = Field(16, ge=1)
    backlog_per_worker: int | None = Field(None, ge=1, description="default: max_concurrent_activities")
    scale_up_cooldown_s: float = Field(6.0, ge=0.0)
    scale_down_cooldown_s: float = Field(30.0, ge=0.0)
    poll_interval_s: float = Field(2.0, gt=0.0)

    @model_validator(mode="after")
    def _bounds(self) -> ElasticPoolConfig:
        if self.min_workers > self.max_workers:
            raise ValueError(f"min_workers ({self.min_workers}) exceeds max_workers ({self.max_workers})")
        return self

    @property
    def per_worker(self) -> int:
        """Backlog one more worker is expected to absorb."""
        return self.backlog_per_worker or self.max_concurrent_activities


def default_pools() -> dict[str, ElasticPoolConfig]:
    """The `pools` a job gets when it sets none: the serverless pool's default scaling."""
    return {Pool.SERVERLESS.value: ElasticPoolConfig()}


def known_elastic_pools(pools: dict[str, ElasticPoolConfig]) -> dict[str, ElasticPoolConfig]:
    """`pools` names elastic pools only; the ones it leaves out keep their defaults."""
    elastic = ", ".join(p.value for p in ELASTIC_POOLS)
    for name in pools:
        if name not in {p.value for p in Pool}:
            raise ValueError(f"unknown pool {name!r}; pools are: {', '.join(p.value for p in Pool)}")
        if Pool(name) not in ELASTIC_POOLS:
            raise ValueError(f"pool {name!r} has a fixed set of workers; only {elastic} scales (pools.{name})")
    return {**default_pools(), **pools}


def check_generation_pool(pool: Pool) -> Pool:
    """A task generates on a pool whose workers hold an inference engine."""
    if pool not in GENERATION_POOLS:
        names = ", ".join(p.value for p in GENERATION_POOLS)
        raise ValueError(f"{pool.value!r} has no inference engine; generate_pool must be one of: {names}")
    return pool


def check_session_pool(pool: Pool | None) -> Pool | None:
    """A task's env sessions live on a pool whose workers can hold them (None: the default, cpu)."""
    if pool is not None and pool not in ENV_POOLS:
        names = ", ".join(p.value for p in ENV_POOLS)
        raise ValueError(f"{pool.value!r} workers cannot hold env sessions; env_pool must be one of: {names}")
    return pool


def check_rewards_have_workers(tasks: Sequence[TaskSpec], pools: dict[str, ElasticPoolConfig]) -> None:
    """No task's reward goes to an elastic pool that may have no worker. Where a reward goes depends on its
    declaration (`@reward(serverless=...)`), so `resolve` checks this, once it has read the declarations."""
    for i, t in enumerate(tasks):
        scaling = pools.get(t.reward_queue)
        if scaling is not None and scaling.max_workers == 0:
            raise ValueError(
                f"tasks.{i} ({t.name}) places its reward on pool {t.reward_queue!r}, but pools.{t.reward_queue}"
                f".max_workers is 0, so no worker would ever run it; raise max_workers or set "
                "reward_placement: colocated"
            )
