"""Stall bookkeeping of the training workflow: pure functions from queue descriptions over time to stalls.

A pool stalls when its queue has work waiting and no sign of a live worker (a current heartbeat, a poll) for
`no_worker_after_s`; the job stalls when no trajectory has reported for `no_progress_factor` × the recent
median interval between reports (at least `no_progress_min_s`) while some are in flight. Deterministic:
times are workflow time.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence

from rollart.contracts.activities import QueueState
from rollart.contracts.training import Stall, StallWatch, stall_summary
from rollart.spec.config import AUTO_POOL, StallConfig, TaskSpec
from rollart.spec.pools import Pool

__all__ = [
    "FINISHES_KEPT",
    "MIN_FINISHES",
    "check",
    "median_interval",
    "overdue",
    "progressed",
    "summary",
    "watched_pools",
]

FINISHES_KEPT = 32
"""How many recent report times the median interval is taken over."""

MIN_FINISHES = 4
"""Below this many reports there is no median to judge silence by."""


def watched_pools(tasks: list[TaskSpec], placement_pools: Sequence[str] = ()) -> list[str]:
    """The pools whose activity queues a job's work waits on: env, generation and reward pools, and the trainer
    (for a `generate_pool: auto` task, every pool it may be placed on)."""
    pools = [
        p
        for t in tasks
        for p in (
            t.env_queue,
            *(placement_pools if t.generate_pool == AUTO_POOL else [t.generate_pool]),
            t.reward_queue,
        )
    ]
    return list(dict.fromkeys([*pools, Pool.TRAINER.value]))


def progressed(watch: StallWatch, now: float, *, finished: bool) -> StallWatch:
    """A trajectory reported (`finished`) or a step trained: progress, so the job is not silent."""
    finishes = [*watch.finishes, now][-FINISHES_KEPT:] if finished else watch.finishes
    return watch.model_copy(update={"finishes": finishes, "active_at": now})


def median_interval(finishes: list[float]) -> float | None:
    """The median gap between successive reports (reports at the same instant count once)."""
    times = sorted(set(finishes))
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return statistics.median(gaps) if len(gaps) >= MIN_FINISHES - 1 else None


def _no_worker(prev: dict[str, Stall], pool: str, q: QueueState, now: float, cfg: StallConfig) -> Stall | None:
    """Work waiting and no live worker: the condition, since the last sign of a worker.

    A worker whose heartbeat is current is alive even when it does not poll (all its slots busy). Without
    one, the clock runs from the newest heartbeat or poll, so a killed worker is reported
    `no_worker_after_s` after its death, not after Temporal forgets its poller (minutes). Descriptions
    recorded before heartbeats were read (no `workers`, no `last_seen_s_ago`) keep the old rule: nobody
    polling, since the first check that saw it. Only a condition that two checks in a row see is reported: one
    check can catch a task in the instant before a waiting long poll takes it, while that poll, started long
    ago, is the queue's last sign of life.
    """
    if q.backlog <= 0 or q.workers:
        return None
    first_seen = prev[pool].since if pool in prev else now
    if q.workers is None and q.last_seen_s_ago is None:  # an old description: pollers only
        if q.pollers > 0:
            return None
        since = first_seen
    else:
        since = first_seen if q.last_seen_s_ago is None else now - q.last_seen_s_ago
    return Stall(
        reason="no_worker",
        pool=pool,
        since=since,
        seen_at=now,
        backlog=q.backlog,
        reported=pool in prev and now - since >= cfg.no_worker_after_s,
    )


def _no_progress(watch: StallWatch, now: float, in_flight: int, cfg: StallConfig) -> Stall | None:
    """Trajectories in flight, and none reported for far longer than usual."""
    median = median_interval(watch.finishes)
    if in_flight == 0 or median is None:
        return None
    silent = now - watch.active_at
    if silent < max(cfg.no_progress_factor * median, cfg.no_progress_min_s):
        return None
    return Stall(reason="no_progress", since=watch.active_at, seen_at=now, in_flight=in_flight, reported=True)


def check(watch: StallWatch, queues: dict[str, QueueState], now: float, in_flight: int, cfg: StallConfig) -> StallWatch:
    """The watch after one check: `queues` maps each watched pool to its queue's description."""
    prev = {x.pool: x for x in watch.open if x.reason == "no_worker" and x.pool is not None}
    found = [_no_worker(prev, pool, q, now, cfg) for pool, q in queues.items()]
    found.append(_no_progress(watch, now, in_flight, cfg))
    return watch.model_copy(update={"open": [x for x in found if x is not None]})


def overdue(watch: StallWatch, cfg: StallConfig) -> Stall | None:
    """The first reported stall that has lasted `fail_after_s`, when the job is to give up on one."""
    if cfg.fail_after_s is None:
        return None
    return next((x for x in watch.stalls if x.seen_at - x.since >= cfg.fail_after_s), None)


summary = stall_summary
