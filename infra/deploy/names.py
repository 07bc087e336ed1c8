"""How a job's Kubernetes objects are named, labelled and selected: the vocabulary every renderer module shares."""

from __future__ import annotations

import re
from typing import Any

from rollart.spec.config import JobSpec
from rollart.spec.config.kubernetes import KubernetesConfig
from rollart.spec.pools import Pool

__all__ = [
    "K8sRenderError",
    "Manifest",
    "app_labels",
    "app_name",
    "object_meta",
    "pod_selector",
    "pools_selector",
    "rendezvous_address",
    "trainer_name",
]

Manifest = dict[str, Any]


class K8sRenderError(ValueError):
    """The job cannot be laid out on a cluster as configured; the message says what to change."""


def app_name(job: JobSpec) -> str:
    """Prefix of every object's name: `kubernetes.name`, else the job name made DNS-safe."""
    cfg = job.kubernetes or KubernetesConfig()
    if cfg.name:
        return cfg.name
    name = re.sub(r"[^a-z0-9-]+", "-", job.name.lower()).strip("-")[:40].strip("-")
    return name or "rollart"


def app_labels(app: str, pool: str | None = None) -> dict[str, str]:
    """The labels of every object of one app; a pool's objects also carry the pool as their component."""
    labels = {
        "app.kubernetes.io/name": "rollart",
        "app.kubernetes.io/instance": app,
        "app.kubernetes.io/managed-by": "rollart",
    }
    if pool is not None:
        labels["app.kubernetes.io/component"] = str(pool)  # a plain str (yaml.safe_dump refuses a Pool)
    return labels


def object_meta(name: str, app: str, cfg: KubernetesConfig, pool: str | None = None) -> dict[str, Any]:
    """An object's metadata: its name, the job's namespace, the app's (and pool's) labels."""
    return {"name": name, "namespace": cfg.namespace, "labels": app_labels(app, pool)}


def pod_selector(labels: dict[str, str]) -> dict[str, Any]:
    """The labels that pick one pool's pods of one app (a workload's selector, the trainer Service's)."""
    return {"matchLabels": {k: labels[k] for k in ("app.kubernetes.io/instance", "app.kubernetes.io/component")}}


def pools_selector(app: str, names: list[str]) -> dict[str, Any]:
    """Every pool's pods of one app (workers and trainer nodes of the pools `names`; not its env servers)."""
    pools = {"key": "app.kubernetes.io/component", "operator": "In", "values": names}
    return {"matchLabels": {"app.kubernetes.io/instance": app}, "matchExpressions": [pools]}


def trainer_name(app: str) -> str:
    """The trainer's StatefulSet and headless Service (one name: the pods' DNS names are built from both)."""
    return f"{app}-{Pool.TRAINER.value}"


def rendezvous_address(job: JobSpec) -> str:
    """Trainer node 0's HOST:PORT as every trainer pod reaches it: pod 0's name under the headless Service."""
    cfg = job.kubernetes or KubernetesConfig()
    app = app_name(job)
    return f"{trainer_name(app)}-0.{trainer_name(app)}.{cfg.namespace}.svc.cluster.local:{cfg.rdzv_port}"
