"""Hardware pools: the names of the task queues each kind of work is routed to.

A pool is a Temporal task queue. Any number of workers, on any number of
machines, poll it; pinning a pool to a GPU type happens where its workers run
(a node selector on Kubernetes, the machine you start `rollart worker` on).
"""

from __future__ import annotations

from enum import Enum

__all__ = [
    "ENV_POOLS",
    "GENERATION_POOLS",
    "QUEUE_PREFIX_PATTERN",
    "WORKER_POOLS",
    "Pool",
    "queue_name",
    "session_queue",
]


class Pool(str, Enum):
    """Every queue rollart routes work to; the value is the task-queue name."""

    H20 = "h20"  # decode-heavy generation (memory-bandwidth bound)
    H800 = "h800"  # prefill-heavy generation and training (compute bound)
    CPU = "cpu"  # stateful environments
    SERVERLESS = "serverless"  # stateless rewards, elastic
    TRAINER = "trainer"  # the trainer process (model + optimizer)
    CONTROL = "control"  # workflows only: orchestration, no heavy work

    def __str__(self) -> str:
        return self.value


GENERATION_POOLS: tuple[Pool, ...] = (Pool.H20, Pool.H800)
"""Pools whose workers hold an inference engine."""

ENV_POOLS: tuple[Pool, ...] = (Pool.CPU, *GENERATION_POOLS)
"""Pools whose workers may hold env sessions: long-lived processes that take many activities at once (serverless
workers come and go with the backlog, the trainer takes one step at a time, control runs workflows only)."""

WORKER_POOLS: tuple[Pool, ...] = (Pool.CONTROL, Pool.CPU, Pool.H800, Pool.H20, Pool.SERVERLESS, Pool.TRAINER)
"""Pools that `rollart up` starts a worker for by default."""


QUEUE_PREFIX_PATTERN = r"^[A-Za-z0-9_.-]*$"
"""What a task-queue prefix may contain (it becomes part of every queue name)."""


def queue_name(pool: Pool | str, prefix: str = "") -> str:
    """The task queue of `pool` for a job whose queues carry `prefix`: jobs (or tests) sharing one server keep
    their own workers apart by prefix; "" is the pool's plain name."""
    return f"{prefix}{pool}"


def session_queue(worker_id: str, prefix: str = "", pool: Pool = Pool.CPU) -> str:
    """The private queue of one env worker of `pool`: `step`/`close` of its sessions go here (sticky routing)."""
    return f"{queue_name(pool, prefix)}@{worker_id}"
