"""The Temporal Secret in a job's pods: its TLS files and API key, mounted as files (never environment variables).

The Secret is not rendered (its contents are not the job's): `secret_command` says how to create it. Who may reach
the pods is `network`'s; what they run as, `pod_security`'s.
"""

from __future__ import annotations

import shlex
from typing import Any

from rollart.infra.deploy.names import app_name
from rollart.spec.config import JobSpec
from rollart.spec.config.kubernetes import KubernetesConfig

__all__ = [
    "API_KEY_KEY",
    "API_KEY_PATH",
    "SECRET_KEYS",
    "TEMPORAL_MOUNT",
    "secret_command",
    "temporal_credentials",
    "temporal_secret_name",
]

TEMPORAL_MOUNT = "/etc/rollart-temporal"
"""Where the Temporal Secret's files are mounted (beside, not inside, the read-only job mount)."""

SECRET_KEYS = {"ca": "ca.crt", "cert": "tls.crt", "key": "tls.key"}
"""The Temporal Secret's key for each `temporal.tls` file; the API key is under `API_KEY_KEY`."""

API_KEY_KEY = "api-key"

API_KEY_PATH = f"{TEMPORAL_MOUNT}/{API_KEY_KEY}"
"""Where the pods read the API key (their job's `temporal.api_key_file`)."""


def temporal_secret_name(job: JobSpec) -> str:
    """The Secret of the job's Temporal TLS files and API key: `kubernetes.temporal_secret`, else `<app>-temporal`."""
    cfg = job.kubernetes or KubernetesConfig()
    return cfg.temporal_secret or f"{app_name(job)}-temporal"


def secret_command(job: JobSpec) -> str | None:
    """The `kubectl create secret` line that makes the Temporal Secret from this machine's files and environment
    (the job's `temporal.tls` paths and `api_key_file` as given, `$<api_key_env>`), or None when the job uses none."""
    t = job.temporal
    if not t.secured:
        return None
    cfg = job.kubernetes or KubernetesConfig()
    parts = [f"kubectl -n {cfg.namespace} create secret generic {temporal_secret_name(job)}"]
    files = t.tls.files() if t.tls is not None else {}
    parts += [f"--from-file={SECRET_KEYS[field]}={shlex.quote(str(path))}" for field, path in files.items()]
    if t.api_key_env:
        parts.append(f'--from-literal={API_KEY_KEY}="${t.api_key_env}"')
    if t.api_key_file is not None:
        parts.append(f"--from-file={API_KEY_KEY}={shlex.quote(str(t.api_key_file))}")
    return " \\\n    ".join(parts)


def temporal_credentials(job: JobSpec, mounts: list[dict[str, Any]], volumes: list[dict[str, Any]]) -> None:
    """The Temporal Secret in a pod: its TLS files and API key as files at TEMPORAL_MOUNT (read-only, private to
    the image's group), which the pods' job names (`render.cluster_job`). A file, not a variable: it is not in the
    environment of every process the worker starts (trainer ranks, agent programs, tool calls), nor in the pod
    spec's readers' view. A Secret without a key the job needs keeps the pod from starting.
    """
    t = job.temporal
    keys = [SECRET_KEYS[field] for field in (t.tls.files() if t.tls is not None else {})]
    if t.has_api_key:
        keys.append(API_KEY_KEY)
    if not keys:
        return
    items = [{"key": key, "path": key} for key in keys]
    mounts.append({"name": "temporal-credentials", "mountPath": TEMPORAL_MOUNT, "readOnly": True})
    volumes.append(
        {
            "name": "temporal-credentials",
            "secret": {"secretName": temporal_secret_name(job), "items": items, "defaultMode": 0o440},
        }
    )
