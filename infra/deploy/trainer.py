"""The trainer on a cluster: a StatefulSet of `pools.trainer.replicas` nodes (one GPU per trainer rank) and a
headless Service.

Pod k is node rank k, and every node meets node 0 (pod 0) at its stable DNS name
(`names.rendezvous_address`). A StatefulSet never runs two pods of one identity, so no rank is ever trained
twice over.
"""

from __future__ import annotations

from typing import Any

from rollart.infra.deploy.names import Manifest, app_labels, app_name, object_meta, pod_selector, trainer_name
from rollart.infra.deploy.workloads import pod_spec
from rollart.spec.config import JobSpec
from rollart.spec.config.kubernetes import KubernetesConfig, ResolvedPool
from rollart.spec.pools import Pool

__all__ = ["trainer_service", "trainer_statefulset"]


def trainer_service(job: JobSpec) -> Manifest:
    """The trainer's headless Service: gives each trainer pod a stable DNS name, pod 0's being the rendezvous.

    Addresses are published before the pods are ready, so the nodes can meet while they start up.
    """
    cfg = job.kubernetes or KubernetesConfig()
    app = app_name(job)
    labels = app_labels(app, Pool.TRAINER)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(trainer_name(app), app, cfg, Pool.TRAINER),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": pod_selector(labels)["matchLabels"],
            "ports": [{"name": "rdzv", "port": cfg.rdzv_port, "targetPort": cfg.rdzv_port, "protocol": "TCP"}],
        },
    }


def trainer_statefulset(job: JobSpec, pool: ResolvedPool, address: str, job_digest: str) -> Manifest:
    """The trainer's nodes: pod k runs `rollart worker --pool trainer --node-rank k`, with its ranks' GPUs.

    All pods start together (`Parallel`: node 0 waits for the others at the rendezvous). A
    StatefulSet keeps one pod per identity, so a replaced node never overlaps the one it replaces.
    """
    cfg = job.kubernetes or KubernetesConfig()
    app = app_name(job)
    labels = app_labels(app, Pool.TRAINER)
    spec: dict[str, Any] = {
        "serviceName": trainer_name(app),
        "replicas": pool.replicas,
        "podManagementPolicy": "Parallel",
        "selector": pod_selector(labels),
        "template": {
            "metadata": {"labels": labels, "annotations": {"rollart.dev/job-sha256": job_digest}},
            "spec": pod_spec(job, cfg, app, pool, address),
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": object_meta(trainer_name(app), app, cfg, Pool.TRAINER),
        "spec": spec,
    }
