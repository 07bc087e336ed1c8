"""How a job's reward pools scale: a KEDA `ScaledObject` on each pool's Temporal queue backlog (with a
TriggerAuthentication for a secured Temporal), or a CPU-based HorizontalPodAutoscaler where KEDA is absent
(`kubernetes.serverless.keda: false`)."""

from __future__ import annotations

from typing import Any

from rollart.infra.deploy.names import K8sRenderError, Manifest, app_name, object_meta
from rollart.infra.deploy.security import API_KEY_KEY, SECRET_KEYS, temporal_secret_name
from rollart.spec.config import JobSpec, TemporalConfig
from rollart.spec.config.kubernetes import KubernetesConfig
from rollart.spec.pools import Pool

__all__ = ["scaled_object", "serverless_hpa", "temporal_trigger_auth"]


def scaled_object(
    app: str,
    cfg: KubernetesConfig,
    address: str,
    temporal_namespace: str,
    secured: TemporalConfig | None = None,
    pool: str = Pool.SERVERLESS.value,
) -> Manifest:
    """KEDA (v2.17+) scales a reward pool's Deployment (`serverless`) on its Temporal activity backlog, down to 0
    when idle, as `kubernetes.serverless` says.

    `secured`: the job's Temporal settings when they use TLS or an API key, which KEDA then takes from the
    TriggerAuthentication `temporal_trigger_auth` renders (and the server name from the trigger).
    """
    s = cfg.serverless
    metadata = {
        "endpoint": address,
        "namespace": temporal_namespace,
        "taskQueue": pool,
        "queueTypes": "activity",
        "targetQueueSize": str(s.target_queue_size),
        "activationTargetQueueSize": str(s.activation_queue_size),
    }
    trigger: dict[str, Any] = {"type": "temporal", "metadata": metadata}
    if secured is not None:
        trigger["authenticationRef"] = {"name": _trigger_auth_name(app)}
        if secured.tls is not None and secured.tls.server_name:
            metadata["tlsServerName"] = secured.tls.server_name
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": object_meta(f"{app}-{pool}", app, cfg, pool),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": f"{app}-{pool}"},
            "minReplicaCount": s.min_replicas,
            "maxReplicaCount": s.max_replicas,
            "pollingInterval": s.polling_interval_s,
            "cooldownPeriod": s.cooldown_period_s,
            "triggers": [trigger],
        },
    }


def temporal_trigger_auth(job: JobSpec) -> Manifest | None:
    """KEDA's credentials for the job's Temporal server, from the Temporal Secret; None when the job uses none.

    KEDA's temporal scaler speaks TLS only with an API key (and then trusts only the system's roots) or with a
    client certificate (and then the CA given): other secured layouts could not scale, so they are refused.
    """
    t = job.temporal
    if not t.secured:
        return None
    files = t.tls.files() if t.tls is not None else {}
    if "cert" not in files and not t.has_api_key:
        raise K8sRenderError(
            "KEDA's temporal scaler uses TLS only with a client certificate or an API key, and the job has "
            "temporal.tls without either: scale serverless with the CPU HPA (kubernetes.serverless.keda: false, "
            "or --hpa), or give the scaler credentials (temporal.tls.cert/key or temporal.api_key_env/api_key_file)"
        )
    if "ca" in files and "cert" not in files:
        raise K8sRenderError(
            "KEDA's temporal scaler checks the server against the system's roots when it has only an API key, so "
            "it cannot use temporal.tls.ca: give the job a client certificate too (temporal.tls.cert/key), or "
            "scale serverless with the CPU HPA (kubernetes.serverless.keda: false, or --hpa)"
        )
    cfg = job.kubernetes or KubernetesConfig()
    app = app_name(job)
    secret = temporal_secret_name(job)
    refs = [{"parameter": field, "name": secret, "key": SECRET_KEYS[field]} for field in files]
    if t.has_api_key:
        refs.append({"parameter": "apiKey", "name": secret, "key": API_KEY_KEY})
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "TriggerAuthentication",
        "metadata": object_meta(_trigger_auth_name(app), app, cfg, Pool.SERVERLESS),
        "spec": {"secretTargetRef": refs},
    }


def serverless_hpa(
    app: str, cfg: KubernetesConfig, address: str, temporal_namespace: str, pool: str = Pool.SERVERLESS.value
) -> Manifest:
    """Without KEDA: a plain HPA on CPU utilisation (reward work is CPU work) of a reward pool's Deployment. It
    cannot scale to 0."""
    s = cfg.serverless
    name = f"{app}-{pool}"
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": object_meta(name, app, cfg, pool),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": max(1, s.min_replicas),
            "maxReplicas": s.max_replicas,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": {"type": "Utilization", "averageUtilization": s.cpu_utilization_percent},
                    },
                }
            ],
        },
    }


def _trigger_auth_name(app: str) -> str:
    return f"{app}-temporal"
