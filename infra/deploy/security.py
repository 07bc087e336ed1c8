"""What keeps a job's pods and services to themselves: the Temporal Secret (TLS files, API key) and, with a
Mooncake store, the NetworkPolicies around Mooncake's listeners.

The Secret is not rendered (its contents are not the job's): `secret_command` says how to create it.
"""

from __future__ import annotations

import shlex
from typing import Any

from rollart.infra.deploy.names import Manifest, app_name, object_meta, pools_selector
from rollart.spec.config import JobSpec
from rollart.spec.config.kubernetes import KubernetesConfig

__all__ = [
    "API_KEY_KEY",
    "SECRET_KEYS",
    "TEMPORAL_MOUNT",
    "mooncake_network_policies",
    "secret_command",
    "temporal_credentials",
    "temporal_secret_name",
]

TEMPORAL_MOUNT = "/etc/rollart-temporal"
"""Where the Temporal Secret's TLS files are mounted (beside, not inside, the read-only job mount)."""

SECRET_KEYS = {"ca": "ca.crt", "cert": "tls.crt", "key": "tls.key"}
"""The Temporal Secret's key for each `temporal.tls` file; the API key is under `API_KEY_KEY`."""

API_KEY_KEY = "api-key"


def temporal_secret_name(job: JobSpec) -> str:
    """The Secret of the job's Temporal TLS files and API key: `kubernetes.temporal_secret`, else `<app>-temporal`."""
    cfg = job.kubernetes or KubernetesConfig()
    return cfg.temporal_secret or f"{app_name(job)}-temporal"


def secret_command(job: JobSpec) -> str | None:
    """The `kubectl create secret` line that makes the Temporal Secret from this machine's files and environment
    (the job's `temporal.tls` paths as given, `$<api_key_env>`), or None when the job uses neither."""
    t = job.temporal
    if not t.secured:
        return None
    cfg = job.kubernetes or KubernetesConfig()
    parts = [f"kubectl -n {cfg.namespace} create secret generic {temporal_secret_name(job)}"]
    files = t.tls.files() if t.tls is not None else {}
    parts += [f"--from-file={SECRET_KEYS[field]}={shlex.quote(str(path))}" for field, path in files.items()]
    if t.api_key_env:
        parts.append(f'--from-literal={API_KEY_KEY}="${t.api_key_env}"')
    return " \\\n    ".join(parts)


def temporal_credentials(
    job: JobSpec, mounts: list[dict[str, Any]], volumes: list[dict[str, Any]], env: list[dict[str, Any]]
) -> None:
    """The Temporal Secret in a pod: its TLS files at TEMPORAL_MOUNT (read-only, private), its API key in the
    variable `temporal.api_key_env` names. A Secret without a key the job needs keeps the pod from starting."""
    t = job.temporal
    files = t.tls.files() if t.tls is not None else {}
    secret = temporal_secret_name(job)
    if files:
        items = [{"key": SECRET_KEYS[field], "path": SECRET_KEYS[field]} for field in files]
        mounts.append({"name": "temporal-tls", "mountPath": TEMPORAL_MOUNT, "readOnly": True})
        volumes.append({"name": "temporal-tls", "secret": {"secretName": secret, "items": items, "defaultMode": 0o440}})
    if t.api_key_env:
        env.append({"name": t.api_key_env, "valueFrom": {"secretKeyRef": {"name": secret, "key": API_KEY_KEY}}})


def mooncake_network_policies(job: JobSpec) -> list[Manifest]:
    """With a Mooncake store: only the job's pool pods (and the Mooncake pods) may reach the Mooncake master and
    keeper pods (`kubernetes.mooncake.pod_labels`) or the pool pods themselves, whose transfer engines listen on
    every interface. None with a local store or `kubernetes.mooncake.network_policy: false`."""
    cfg = job.kubernetes or KubernetesConfig()
    if job.store.kind != "mooncake" or not cfg.mooncake.network_policy:
        return []
    app = app_name(job)

    def mooncake() -> dict[str, Any]:
        return {"matchLabels": dict(cfg.mooncake.pod_labels)}

    def policy(name: str, selector: dict[str, Any]) -> Manifest:
        peers = [{"podSelector": pools_selector(app, list(job.pools))}, {"podSelector": mooncake()}]
        return {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": object_meta(name, app, cfg),
            "spec": {"podSelector": selector, "policyTypes": ["Ingress"], "ingress": [{"from": peers}]},
        }

    pool_pods = pools_selector(app, list(job.pools))
    return [policy(f"{app}-mooncake-ingress", mooncake()), policy(f"{app}-pools-ingress", pool_pods)]
