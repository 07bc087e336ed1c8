"""The store's claims collected on a cluster: a CronJob running `rollart store gc` against the job's Temporal.

Claims (task specs, bulk inputs, large payloads) are written to the store for the workflows that refer to them and
kept until none of their job's workflows remains on the server (client/claims.py). On a cluster that sweep runs as
a CronJob of its own, in the CPU image, with the job spec, the store volume and the Temporal credentials every
worker pod has. Rendered for a local store (on the shared volume) only: with Mooncake nothing is listed on disk.
"""

from __future__ import annotations

from typing import Any

from rollart.infra.deploy.names import Manifest, app_labels, app_name, object_meta
from rollart.infra.deploy.pod_security import container_security_context, pod_security_context, scratch_volumes
from rollart.infra.deploy.security import temporal_credentials
from rollart.infra.deploy.workloads import JOB_MOUNT
from rollart.spec.config import JobSpec
from rollart.spec.config.kubernetes import KubernetesConfig

__all__ = ["store_gc_cronjob"]


def store_gc_cronjob(job: JobSpec, address: str) -> Manifest | None:
    """`rollart store gc` on `kubernetes.store_gc_schedule` (None: not rendered, or the store is not local)."""
    cfg = job.kubernetes or KubernetesConfig()
    if cfg.store_gc_schedule is None or job.store.kind != "local":
        return None
    app = app_name(job)
    mounts: list[dict[str, Any]] = [
        {"name": "job", "mountPath": JOB_MOUNT, "readOnly": True},
        {"name": "store", "mountPath": cfg.store_mount},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "job", "configMap": {"name": f"{app}-job"}},
        {"name": "store", "persistentVolumeClaim": {"claimName": f"{app}-store"}},
    ]
    scratch_volumes(mounts, volumes)
    temporal_credentials(job, mounts, volumes)
    env: list[dict[str, Any]] = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    container = {
        "name": "store-gc",
        "image": cfg.image,
        "imagePullPolicy": cfg.image_pull_policy,
        "command": ["rollart", "store", "gc", "--job", f"{JOB_MOUNT}/job.yaml", "--temporal-address", address],
        "env": env,
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "volumeMounts": mounts,
        "securityContext": container_security_context(cfg),
    }
    pod = {
        "restartPolicy": "OnFailure",
        "containers": [container],
        "volumes": volumes,
        "securityContext": pod_security_context(),
    }
    labels = app_labels(app, "store-gc")  # the job's pods: under its NetworkPolicies, which let nothing in
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": object_meta(f"{app}-store-gc", app, cfg),
        "spec": {
            "schedule": cfg.store_gc_schedule,
            "concurrencyPolicy": "Forbid",  # a sweep still running is not raced by the next
            "jobTemplate": {"spec": {"backoffLimit": 2, "template": {"metadata": {"labels": labels}, "spec": pod}}},
        },
    }
