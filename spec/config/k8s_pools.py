"""The `kubernetes` section's per-pool layout: a pool's deployment overrides (`PoolDeployment`), what a pool gets
by default from its declaration (`pool_defaults`), and the concrete result (`ResolvedPool`). Pydantic models only,
imported with the job spec (spec/config/kubernetes.py holds the section itself)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollart.spec.pools import PoolName, PoolRole, PoolSpec

__all__ = [
    "GPU_PRODUCT_LABEL",
    "PoolDeployment",
    "ResolvedPool",
    "Strict",
    "Toleration",
    "check_quantity",
    "pool_defaults",
]

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
"""The node label NVIDIA's GPU feature discovery sets to the GPU model (e.g. `NVIDIA-H800`)."""

_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|Ki|Mi|Gi|Ti|Pi)?$")


class Strict(BaseModel):
    """Unknown keys are errors: a typo in a deployment setting must not be silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def check_quantity(value: str | None) -> str | None:
    if value is not None and not _QUANTITY.match(value):
        raise ValueError(f"not a Kubernetes quantity: {value!r} (examples: '500m', '4', '16Gi')")
    return value


class Toleration(Strict):
    """A pod toleration, as in the Kubernetes API (lets pods land on tainted GPU nodes)."""

    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Exists"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None

    def manifest(self) -> dict[str, str]:
        """The toleration as it goes into a pod spec (unset fields left out)."""
        return self.model_dump(exclude_none=True)


class PoolDeployment(Strict):
    """Overrides for one pool; `None` keeps the pool's default (see `pool_defaults`)."""

    replicas: int | None = Field(
        None, ge=0, description="workers of this pool (for the trainer: its nodes); 0 leaves the pool out"
    )
    gpus: int | None = Field(
        None, ge=0, description="GPUs per worker (the `nvidia.com/gpu` resource); 0 runs the pool on CPUs"
    )
    gpu_product: str | None = Field(None, min_length=1, description=f"value of the `{GPU_PRODUCT_LABEL}` node label")
    cpu: str | None = Field(None, description="CPU request per worker, e.g. '4' or '500m'")
    memory: str | None = Field(None, description="memory request and limit per worker, e.g. '16Gi'")
    node_selector: dict[str, str] = Field(default_factory=dict, description="extra node labels the pods require")
    tolerations: list[Toleration] | None = Field(None, description="replaces the default (GPU taint) tolerations")

    _quantities = field_validator("cpu", "memory")(check_quantity)


class ResolvedPool(Strict):
    """One pool's concrete deployment: the defaults with the job's overrides applied."""

    pool: PoolName
    role: PoolRole
    replicas: int
    gpus: int
    gpu_product: str | None
    cpu: str
    memory: str
    node_selector: dict[str, str]
    tolerations: list[Toleration]


_GPU_TAINT = Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")


_CPU_BY_ROLE: dict[PoolRole, tuple[str, str]] = {
    "control": ("1", "2Gi"),
    "env": ("4", "8Gi"),
    "generation": ("8", "64Gi"),
    "reward": ("1", "2Gi"),
    "trainer": ("8", "64Gi"),
}
"""CPU and memory requests per worker of a pool without GPUs, by role."""


def pool_defaults(name: str, spec: PoolSpec, gpus: int = 1) -> ResolvedPool:
    """What pool `name` gets when the kubernetes section says nothing, from its declaration `spec`: a GPU pool
    (`gpu:` declared) `gpu.count` GPUs of `gpu.product` (else `gpus`), the GPU taint tolerated; a CPU pool none.

    `gpus` is what one worker of a GPU pool needs by default: its engine's tensor-parallel size for generation,
    its share of the trainer's ranks for a trainer node (`KubernetesConfig.worker_gpus`).
    """
    base: dict[str, object] = {"replicas": 1, "gpus": 0, "gpu_product": None, "node_selector": {}, "tolerations": []}
    cpu, memory = _CPU_BY_ROLE[spec.role]
    if spec.gpu is not None:
        gpu_count = spec.gpu.count or gpus
        base |= {"gpus": gpu_count, "gpu_product": spec.gpu.product, "tolerations": [_GPU_TAINT]}
        cpu, memory = "8", "64Gi"
    return ResolvedPool(pool=name, role=spec.role, cpu=cpu, memory=memory, **base)
