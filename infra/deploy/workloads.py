"""A pool's workers on a cluster: its Deployment, and the pod every pool's workload runs (the trainer's too).

A GPU pool (`gpu:` declared) gets a node selector on `gpu.product`, the GPU taint tolerated, and `gpu.count`
GPUs, else as many as its worker uses (a generation worker: `engine.tensor_parallel_size`); pools on GPUs run
the GPU image, the others the CPU image.
"""

from __future__ import annotations

from typing import Any

from rollart.infra.deploy.names import Manifest, app_labels, app_name, object_meta, pod_selector, rendezvous_address
from rollart.infra.deploy.pod_security import (
    IMAGE_GID,
    IMAGE_UID,
    container_security_context,
    pod_security_context,
    scratch_volumes,
)
from rollart.infra.deploy.security import env_token, env_token_pools, temporal_credentials
from rollart.spec.config import JobSpec
from rollart.spec.config.kubernetes import KubernetesConfig, ResolvedPool

__all__ = ["IMAGE_GID", "IMAGE_UID", "JOB_MOUNT", "pod_spec", "pool_deployment"]

JOB_MOUNT = "/etc/rollart"
"""Where the job ConfigMap is mounted; the spec itself is `JOB_MOUNT/job.yaml`."""

_POD_INDEX_FIELD = "metadata.labels['apps.kubernetes.io/pod-index']"  # set on StatefulSet pods (Kubernetes 1.28+)
_GENERATION_GRACE_S = 90  # generation workers drain for up to 60 s (graceful_shutdown_timeout) before exiting


def pool_deployment(job: JobSpec, pool: ResolvedPool, address: str, job_digest: str) -> Manifest:
    """One pool's workers: `rollart worker --pool P` on nodes of the pool's kind, with its resources."""
    if pool.role == "trainer":
        raise ValueError("the trainer is a StatefulSet: use trainer_statefulset")
    cfg = job.kubernetes or KubernetesConfig()
    app = app_name(job)
    name = f"{app}-{pool.pool}"
    labels = app_labels(app, pool.pool)
    spec: dict[str, Any] = {}
    if pool.role != "reward":  # a reward pool's replicas belong to its autoscaler
        spec["replicas"] = pool.replicas
    if pool.role == "generation":  # GPUs are scarce: replace in place rather than surge
        spec["strategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    spec["selector"] = pod_selector(labels)
    spec["template"] = {
        "metadata": {"labels": labels, "annotations": {"rollart.dev/job-sha256": job_digest}},
        "spec": pod_spec(job, cfg, app, pool, address),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(name, app, cfg, pool.pool),
        "spec": spec,
    }


def pod_spec(job: JobSpec, cfg: KubernetesConfig, app: str, pool: ResolvedPool, address: str) -> dict[str, Any]:
    """The pod of a pool's workers: `rollart worker --pool P` with its resources, volumes, Temporal credentials (the
    env-server token too, where its workers call the job's env servers) and node placement."""
    requests: dict[str, Any] = {"cpu": pool.cpu, "memory": pool.memory}
    limits: dict[str, Any] = {"memory": pool.memory}
    if pool.gpus:
        requests[cfg.gpu_resource] = pool.gpus
        limits[cfg.gpu_resource] = pool.gpus
    mounts = [{"name": "job", "mountPath": JOB_MOUNT, "readOnly": True}]
    volumes: list[dict[str, Any]] = [{"name": "job", "configMap": {"name": f"{app}-job"}}]
    if job.store.kind == "local":
        mounts.append({"name": "store", "mountPath": cfg.store_mount})
        volumes.append({"name": "store", "persistentVolumeClaim": {"claimName": f"{app}-store"}})
    if pool.role == "trainer":
        mounts.append({"name": "runs", "mountPath": cfg.runs_mount})
        volumes.append({"name": "runs", "persistentVolumeClaim": {"claimName": f"{app}-runs"}})
    if pool.gpus or pool.role == "trainer":  # vLLM's and the trainer ranks' processes share tensors through
        # /dev/shm (NCCL, gloo, torch multiprocessing); the container default (64 MiB) is too small
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
    scratch_volumes(mounts, volumes)
    temporal_credentials(job, mounts, volumes)
    env: list[dict[str, Any]] = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    if pool.pool in env_token_pools(job):  # its workers open sessions on the job's env servers
        env_token(job, env, mounts, volumes)
    container: dict[str, Any] = {
        "name": "worker",
        "image": cfg.gpu_image if pool.gpus else cfg.image,  # `gpus: 0` runs the pool on CPUs: the CPU build
        "imagePullPolicy": cfg.image_pull_policy,
        "command": _worker_command(job, pool, address),
        "env": env,
        "resources": {"requests": requests, "limits": limits},
        "volumeMounts": mounts,
        "securityContext": container_security_context(cfg),
    }
    if pool.role == "trainer":  # the pod's index in its StatefulSet is its node rank
        env.append({"name": "POD_INDEX", "valueFrom": {"fieldRef": {"fieldPath": _POD_INDEX_FIELD}}})
        container["ports"] = [{"name": "rdzv", "containerPort": cfg.rdzv_port, "protocol": "TCP"}]
    spec: dict[str, Any] = {"containers": [container], "volumes": volumes, "securityContext": pod_security_context()}
    if pool.role == "env" and cfg.env_runtime_class:  # the envs' code (tool calls too) in a sandboxed runtime
        spec["runtimeClassName"] = cfg.env_runtime_class
    node_selector = dict(pool.node_selector)
    if pool.gpu_product and pool.gpus:  # `gpus: 0` runs the pool on any node (e.g. CPU emulation)
        node_selector = {cfg.gpu_product_label: pool.gpu_product, **node_selector}
    if node_selector:
        spec["nodeSelector"] = node_selector
    if pool.tolerations:
        spec["tolerations"] = [t.manifest() for t in pool.tolerations]
    if pool.role == "generation":
        spec["terminationGracePeriodSeconds"] = _GENERATION_GRACE_S
    return spec


def _worker_command(job: JobSpec, pool: ResolvedPool, address: str) -> list[str]:
    """`rollart worker` for the pool; a trainer of several nodes adds its place among them.

    The node rank is the pod's StatefulSet index, which Kubernetes expands from `$(POD_INDEX)`.
    """
    command = [
        "rollart",
        "worker",
        "--pool",
        pool.pool,
        "--job",
        f"{JOB_MOUNT}/job.yaml",
        "--temporal-address",
        address,
    ]
    if pool.role == "trainer" and pool.replicas > 1:
        command += ["--nnodes", str(pool.replicas), "--node-rank", "$(POD_INDEX)", "--rdzv", rendezvous_address(job)]
    return command
