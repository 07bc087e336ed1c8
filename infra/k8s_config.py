"""The job spec's `kubernetes` section: how `rollart k8s render` lays each pool out on a cluster.

Every field has a default, so a job without the section still renders (one replica per pool the
job uses, GPU pools pinned to their GPU product by node selector). Per-pool settings are keyed by
pool name and merged over that pool's defaults (`pool_defaults`); `resolve_pool` gives the
concrete values. Pydantic models only, like `config`: this module is imported with the job spec.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from rollart.infra.pools import GENERATION_POOLS, WORKER_POOLS, Pool

if TYPE_CHECKING:
    from rollart.infra.config import TaskSpec

__all__ = [
    "DEFAULT_TEMPORAL_ADDRESS",
    "GPU_PRODUCT_LABEL",
    "KubernetesConfig",
    "PoolDeployment",
    "ResolvedPool",
    "ServerlessScaling",
    "Toleration",
    "VolumeConfig",
    "pool_defaults",
]

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
"""The node label NVIDIA's GPU feature discovery sets to the GPU model (e.g. `NVIDIA-H800`)."""

DEFAULT_TEMPORAL_ADDRESS = "temporal-frontend.temporal.svc.cluster.local:7233"
"""The frontend of Temporal's Helm chart installed as release `temporal` in namespace `temporal`."""

_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|Ki|Mi|Gi|Ti|Pi)?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class _Strict(BaseModel):
    """Unknown keys are errors: a typo in a deployment setting must not be silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_quantity(value: str | None) -> str | None:
    if value is not None and not _QUANTITY.match(value):
        raise ValueError(f"not a Kubernetes quantity: {value!r} (examples: '500m', '4', '16Gi')")
    return value


class Toleration(_Strict):
    """A pod toleration, as in the Kubernetes API (lets pods land on tainted GPU nodes)."""

    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Exists"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None

    def manifest(self) -> dict[str, str]:
        """The toleration as it goes into a pod spec (unset fields left out)."""
        return self.model_dump(exclude_none=True)


class PoolDeployment(_Strict):
    """Overrides for one pool; `None` keeps the pool's default (see `pool_defaults`)."""

    replicas: int | None = Field(None, ge=0, description="workers of this pool; 0 leaves the pool out")
    gpus: int | None = Field(None, ge=0, description="GPUs per worker (the `nvidia.com/gpu` resource)")
    gpu_product: str | None = Field(None, min_length=1, description=f"value of the `{GPU_PRODUCT_LABEL}` node label")
    cpu: str | None = Field(None, description="CPU request per worker, e.g. '4' or '500m'")
    memory: str | None = Field(None, description="memory request and limit per worker, e.g. '16Gi'")
    node_selector: dict[str, str] = Field(default_factory=dict, description="extra node labels the pods require")
    tolerations: list[Toleration] | None = Field(None, description="replaces the default (GPU taint) tolerations")

    _quantities = field_validator("cpu", "memory")(_check_quantity)


class ResolvedPool(_Strict):
    """One pool's concrete deployment: the defaults with the job's overrides applied."""

    pool: Pool
    replicas: int
    gpus: int
    gpu_product: str | None
    cpu: str
    memory: str
    node_selector: dict[str, str]
    tolerations: list[Toleration]


_GPU_TAINT = Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")


def pool_defaults(pool: Pool) -> ResolvedPool:
    """What a pool gets when the job says nothing: GPU pools one GPU of their product, CPU pools none."""
    gpu = {"gpus": 1, "tolerations": [_GPU_TAINT], "cpu": "8", "memory": "64Gi"}
    table: dict[Pool, dict[str, object]] = {
        Pool.CONTROL: {"cpu": "1", "memory": "2Gi"},
        Pool.CPU: {"cpu": "4", "memory": "8Gi"},
        Pool.H800: {**gpu, "gpu_product": "NVIDIA-H800"},
        Pool.H20: {**gpu, "gpu_product": "NVIDIA-H20"},
        Pool.SERVERLESS: {"cpu": "1", "memory": "2Gi"},
        Pool.TRAINER: {**gpu, "gpu_product": "NVIDIA-H800"},  # training is compute bound: H800 nodes
    }
    base: dict[str, object] = {"replicas": 1, "gpus": 0, "gpu_product": None, "node_selector": {}, "tolerations": []}
    return ResolvedPool(pool=pool, **{**base, **table[pool]})


class ServerlessScaling(_Strict):
    """How the `serverless` pool scales on its Temporal queue backlog (KEDA) or, without KEDA, on CPU (HPA)."""

    keda: bool = Field(True, description="a KEDA ScaledObject on the queue backlog; false: a CPU HPA")
    min_replicas: int = Field(0, ge=0, description="KEDA may scale to 0; the HPA variant keeps at least 1")
    max_replicas: int = Field(10, ge=1)
    target_queue_size: int = Field(2, ge=1, description="backlog per worker KEDA aims for")
    activation_queue_size: int = Field(0, ge=0, description="backlog above which KEDA wakes the pool from 0")
    polling_interval_s: int = Field(10, ge=1)
    cooldown_period_s: int = Field(120, ge=0)
    cpu_utilization_percent: int = Field(70, ge=1, le=100, description="the HPA variant's target")

    @model_validator(mode="after")
    def _min_le_max(self) -> ServerlessScaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) exceeds max_replicas ({self.max_replicas})")
        return self


class VolumeConfig(_Strict):
    """A PersistentVolumeClaim rollart creates (shared store, trainer run dir)."""

    size: str = "50Gi"
    storage_class: str | None = None
    access_mode: Literal["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"] = "ReadWriteMany"

    _quantities = field_validator("size")(_check_quantity)


class KubernetesConfig(_Strict):
    """Where and how the job's workers run on Kubernetes. Every field is optional."""

    image: str = Field("rollart:latest", min_length=1, description="container image with rollart installed")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    namespace: str = Field("rollart", description="Kubernetes namespace for every object")
    name: str | None = Field(None, description="prefix of object names (default: the job name, DNS-safe)")
    temporal_address: str | None = Field(
        None, description=f"Temporal frontend as seen from the pods (default: temporal.address, else {DEFAULT_TEMPORAL_ADDRESS})"
    )
    gpu_product_label: str = Field(GPU_PRODUCT_LABEL, min_length=1, description="node label the GPU product is matched on")
    gpu_resource: str = Field("nvidia.com/gpu", min_length=1, description="extended resource name of a GPU")
    pools: dict[Pool, PoolDeployment] = Field(default_factory=dict, description="per-pool overrides, keyed by pool")
    serverless: ServerlessScaling = Field(default_factory=ServerlessScaling)
    store_volume: VolumeConfig = Field(default_factory=VolumeConfig, description="shared by every worker (local store)")
    runs_volume: VolumeConfig = Field(
        default_factory=lambda: VolumeConfig(size="20Gi", access_mode="ReadWriteOnce"),
        description="the trainer's run dir: checkpoints and step records",
    )
    store_mount: str = Field("/var/lib/rollart/store", pattern=r"^/", description="where the store volume is mounted")
    runs_mount: str = Field("/var/lib/rollart/runs", pattern=r"^/", description="where the trainer's volume is mounted")

    @field_validator("pools", mode="before")
    @classmethod
    def _known_pools(cls, pools: object) -> object:
        if isinstance(pools, dict):
            valid = [p.value for p in WORKER_POOLS]  # every pool, in the order the README lists them
            unknown = [str(k) for k in pools if str(k) not in valid]
            if unknown:
                raise ValueError(f"unknown pool {', '.join(map(repr, unknown))}; pools are: {', '.join(valid)}")
        return pools

    @field_validator("namespace", "name")
    @classmethod
    def _dns_label(cls, value: str | None) -> str | None:
        if value is not None and (len(value) > 40 or not _DNS_LABEL.match(value)):
            raise ValueError(
                f"{value!r} is not a usable Kubernetes name: lower-case letters, digits and '-', at most 40 characters"
            )
        return value

    @model_validator(mode="after")
    def _one_trainer(self) -> KubernetesConfig:
        trainer = self.pools.get(Pool.TRAINER)
        if trainer is not None and trainer.replicas is not None and trainer.replicas > 1:
            raise ValueError(
                f"pools.trainer.replicas is {trainer.replicas}: the trainer is one process holding the model and "
                "optimizer; use 1 (or 0 for a rollout-only deployment)"
            )
        return self

    def resolve_pool(self, pool: Pool, used_generation_pools: set[Pool]) -> ResolvedPool:
        """The pool's concrete settings. A generation pool no task uses defaults to 0 replicas."""
        base = pool_defaults(pool)
        if pool in GENERATION_POOLS and pool not in used_generation_pools:
            base = base.model_copy(update={"replicas": 0})
        override = self.pools.get(pool)
        if override is None:
            return base
        updates = override.model_dump(exclude_none=True, exclude={"node_selector", "tolerations"})
        updates["node_selector"] = {**base.node_selector, **override.node_selector}
        if override.tolerations is not None:
            updates["tolerations"] = override.tolerations
        return base.model_copy(update=updates)

    def unserved(self, tasks: Sequence[TaskSpec]) -> list[str]:
        """Every place the job routes work to a pool this deployment gives no worker, as readable problems.

        Workflows run on `control`; a task's env on `cpu`, its generation on its `generate_pool`, its
        reward on `serverless` or, colocated, on its generation pool (the queues the workflows route to).
        """
        used = {t.generate_pool for t in tasks}
        replicas = {p: self.resolve_pool(p, used).replicas for p in Pool}
        problems = []
        if replicas[Pool.CONTROL] == 0:
            problems.append("pools.control.replicas is 0, but the control pool runs every workflow: give it at least 1")
        for t in tasks:
            needs = [("its env", t.env, Pool.CPU), ("its generation", None, t.generate_pool),
                     ("its reward", t.reward, Pool(t.reward_queue))]  # fmt: skip
            for what, component, pool in needs:
                if replicas[pool] == 0:
                    named = f" {component!r}" if component else ""
                    problems.append(
                        f"task {t.name!r}: {what}{named} runs on pool {pool.value!r}, which has no workers "
                        f"(kubernetes.pools.{pool.value}.replicas is 0): give it at least 1 replica"
                    )
        return problems
