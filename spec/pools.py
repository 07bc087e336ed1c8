"""Pools as data: a pool is a named task queue with a role and, optionally, the GPUs its workers hold.

A pool is a Temporal task queue. Any number of workers, on any number of machines, poll it. Its *role*
(`control | env | generation | reward | trainer`) decides what its workers serve; its name is the queue's
and any string a job declares (`pools: {l40s: {role: generation, gpu: {product: NVIDIA-L40S}}}`). Pinning
a pool to a GPU type happens where its workers run: the node selector `rollart k8s render` derives from
`gpu.product`, or the machine you start `rollart worker --pool l40s` on.

Today's six pools are the defaults every job has (`DEFAULT_POOLS`); a job's declaration is merged over
them (`merge_declared`). Pydantic models and pure queries only: workflows import this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

__all__ = [
    "DEFAULT_POOLS",
    "POOL_NAME_PATTERN",
    "QUEUE_PREFIX_PATTERN",
    "ROLES",
    "SESSION_ROLES",
    "ElasticPoolConfig",
    "GpuSpec",
    "Pool",
    "PoolName",
    "PoolRole",
    "PoolSpec",
    "check_fixed_roles",
    "is_generation",
    "merge_declared",
    "pools_with_role",
    "queue_name",
    "role_problem",
    "session_queue",
]


class Pool(str, Enum):
    """The names of the default pools (`DEFAULT_POOLS`), which every job has; the value is the task-queue name.

    A pool's name is any string a job declares: these are the six that need no declaration.
    """

    H20 = "h20"  # decode-heavy generation (memory-bandwidth bound)
    H800 = "h800"  # prefill-heavy generation and training (compute bound)
    CPU = "cpu"  # stateful environments
    SERVERLESS = "serverless"  # stateless rewards, elastic
    TRAINER = "trainer"  # the trainer process (model + optimizer)
    CONTROL = "control"  # workflows only: orchestration, no heavy work

    def __str__(self) -> str:
        return self.value


PoolRole = Literal["control", "env", "generation", "reward", "trainer"]
"""What a pool's workers serve: workflows, env sessions, an inference engine, rewards, the trainer."""

ROLES: tuple[PoolRole, ...] = get_args(PoolRole)

SESSION_ROLES: tuple[PoolRole, ...] = ("env", "generation")
"""Roles whose workers may hold env sessions: long-lived processes that take many activities at once (reward
workers come and go with the backlog, the trainer takes one step at a time, control runs workflows only)."""

POOL_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
"""A pool's name is a DNS label: it names the pool's Kubernetes objects (`<job>-<pool>`) as well as its queue."""

PoolName = Annotated[str, StringConstraints(pattern=POOL_NAME_PATTERN, max_length=20)]
"""A pool's name as a spec field holds it (a task's `generate_pool`, a worker's `pool`)."""

QUEUE_PREFIX_PATTERN = r"^[A-Za-z0-9_.-]*$"
"""What a task-queue prefix may contain (it becomes part of every queue name)."""


class _Strict(BaseModel):
    """Unknown keys are errors: a typo in a pool's declaration must not be silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ElasticPoolConfig(_Strict):
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


class GpuSpec(_Strict):
    """The GPUs one worker of a pool holds: what `rollart k8s render` asks the cluster for."""

    product: str = Field(min_length=1, description="the GPU's `nvidia.com/gpu.product` node label, e.g. NVIDIA-L40S")
    count: int | None = Field(
        None,
        ge=1,
        description="GPUs per worker (default: what the job needs: engine.tensor_parallel_size for a generation "
        "worker, its share of the trainer's ranks for a trainer node)",
    )


_ELASTIC_DEFAULTS = ElasticPoolConfig().model_dump()


class PoolSpec(ElasticPoolConfig):
    """One pool's declaration: its role, its GPUs, and (reward pools, which are elastic) how its workers scale.

    The scaling fields are `ElasticPoolConfig`'s; reward workers are stateless, so only they may be started
    and stopped with their backlog. Every other pool has a fixed set of workers.
    """

    role: PoolRole
    gpu: GpuSpec | None = Field(None, description="the GPUs one worker holds (None: a CPU pool)")

    @model_validator(mode="after")
    def _scales_only_when_elastic(self) -> PoolSpec:
        scaling = [k for k, v in _ELASTIC_DEFAULTS.items() if getattr(self, k) != v]  # set, and not to its default
        if scaling and self.role != "reward":
            raise ValueError(
                f"{', '.join(scaling)}: {self.role} pools have a fixed set of workers; only reward pools "
                "(serverless) scale with their backlog"
            )
        return self


DEFAULT_POOLS: dict[str, PoolSpec] = {
    Pool.CONTROL.value: PoolSpec(role="control"),
    Pool.CPU.value: PoolSpec(role="env"),
    Pool.H800.value: PoolSpec(role="generation", gpu=GpuSpec(product="NVIDIA-H800")),
    Pool.H20.value: PoolSpec(role="generation", gpu=GpuSpec(product="NVIDIA-H20")),
    Pool.SERVERLESS.value: PoolSpec(role="reward"),
    Pool.TRAINER.value: PoolSpec(role="trainer", gpu=GpuSpec(product="NVIDIA-H800")),  # training is compute bound
}
"""The pools every job has, in the order `rollart up` and the docs list them; a job's `pools:` is merged over."""

_FIXED_ROLES: dict[str, PoolRole] = {Pool.CONTROL.value: "control", Pool.TRAINER.value: "trainer"}
"""Pools the workflows route to by name: the training and rollout workflows run on `control`, train steps on
`trainer`. They keep their role, and no other pool takes it (nothing would route work there)."""


def merge_declared(declared: Any) -> Any:
    """A job's `pools:` merged over `DEFAULT_POOLS`, before validation: a default's entry is laid over its
    declaration field by field (`serverless: {max_workers: 8}` keeps its role, `h800: {gpu: {count: 2}}` its GPU
    product); a new name stands alone.

    Anything but a mapping is left for validation to reject.
    """
    if not isinstance(declared, Mapping):
        return declared
    merged: dict[Any, Any] = dict(DEFAULT_POOLS)
    for name, entry in declared.items():
        default = DEFAULT_POOLS.get(name)
        if default is not None and isinstance(entry, Mapping):
            base = default.model_dump(exclude_unset=True)
            merged[name] = {k: _over(base.get(k), v) for k, v in {**base, **entry}.items()}
        elif default is None and isinstance(entry, Mapping) and "role" not in entry:
            roles = " | ".join(ROLES)
            raise ValueError(
                f"pools.{name}: a pool that is not one of the defaults ({', '.join(DEFAULT_POOLS)}) needs a role "
                f"(role: {roles})"
            )
        else:
            merged[name] = entry
    return merged


def _over(below: Any, above: Any) -> Any:
    """`above` laid over `below`: mappings key by key (`h800: {gpu: {count: 2}}` keeps the product), else `above`."""
    if isinstance(below, Mapping) and isinstance(above, Mapping):
        return {**below, **above}
    return above


def check_fixed_roles(pools: Mapping[str, PoolSpec]) -> list[str]:
    """Problems with the pools the workflows route to by name (`control`, `trainer`), naming the fields."""
    problems = []
    for name, spec in pools.items():
        fixed = _FIXED_ROLES.get(name)
        if fixed is not None and spec.role != fixed:
            problems.append(f"pools.{name}.role is {spec.role}, but the workflows send {fixed} work to {name!r}")
        elif fixed is None and spec.role in _FIXED_ROLES.values():
            owner = next(n for n, r in _FIXED_ROLES.items() if r == spec.role)
            problems.append(
                f"pools.{name}: role {spec.role} belongs to pool {owner!r} alone (the workflows send {spec.role} "
                f"work there); declare {name!r} with another role, or set pools.{owner}.gpu instead"
            )
    return problems


def pools_with_role(pools: Mapping[str, PoolSpec], *roles: PoolRole) -> list[str]:
    """The names of the pools of any of `roles`, in declaration order."""
    return [name for name, spec in pools.items() if spec.role in roles]


def is_generation(pools: Mapping[str, PoolSpec], name: str) -> bool:
    """Whether `name` is a declared pool whose workers hold an inference engine."""
    spec = pools.get(name)
    return spec is not None and spec.role == "generation"


def role_problem(pools: Mapping[str, PoolSpec], name: str, roles: tuple[PoolRole, ...], field: str) -> str | None:
    """Why pool `name`, named by `field`, cannot serve work for `roles`; None when it can.

    The message lists what is declared, so a typo or a missing declaration is plain to see.
    """
    wanted = " or ".join(roles)
    fitting = ", ".join(pools_with_role(pools, *roles)) or "none"
    spec = pools.get(name)
    if spec is None:
        return (
            f"{field}: pool {name!r} is not declared (pools: {', '.join(pools)}); declare it under `pools:` with "
            f"role {wanted}, or use one of the {wanted} pools: {fitting}"
        )
    if spec.role not in roles:
        return f"{field}: pool {name!r} has role {spec.role}, not {wanted}; {wanted} pools: {fitting}"
    return None


def queue_name(pool: str, prefix: str = "") -> str:
    """The task queue of `pool` for a job whose queues carry `prefix`: jobs (or tests) sharing one server keep
    their own workers apart by prefix; "" is the pool's plain name."""
    return f"{prefix}{pool}"


def session_queue(worker_id: str, prefix: str = "", pool: str = Pool.CPU) -> str:
    """The private queue of one env worker of `pool`: `step`/`close` of its sessions go here (sticky routing)."""
    return f"{queue_name(pool, prefix)}@{worker_id}"
