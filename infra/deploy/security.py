"""The job's Secrets in its pods, mounted as files (never environment variables): the Temporal TLS files and API
key, and the env-server token.

No Secret is rendered (their contents are not the job's): `secret_command` and `env_token_command` say how to
create them. Who may reach the pods is `network`'s; what they run as, `pod_security`'s.
"""

from __future__ import annotations

import shlex
from typing import Any

from rollart.infra.deploy.names import app_name
from rollart.infra.deploy.network import env_server_callers
from rollart.infra.env_server_token import TOKEN_FILE_ENV
from rollart.spec.config import JobSpec
from rollart.spec.config.kubernetes import KubernetesConfig

__all__ = [
    "API_KEY_KEY",
    "API_KEY_PATH",
    "ENV_TOKEN_KEY",
    "ENV_TOKEN_MOUNT",
    "ENV_TOKEN_PATH",
    "SECRET_KEYS",
    "TEMPORAL_MOUNT",
    "env_token",
    "env_token_command",
    "env_token_pools",
    "env_token_secret_name",
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

ENV_TOKEN_MOUNT = "/etc/rollart-env-token"
"""Where the env-token Secret is mounted, in the env servers' pods and the pods of the pools that call them."""

ENV_TOKEN_KEY = "token"

ENV_TOKEN_PATH = f"{ENV_TOKEN_MOUNT}/{ENV_TOKEN_KEY}"
"""The token file, which `$ROLLART_ENV_SERVER_TOKEN_FILE` names to the server and the clients."""


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


def env_token_secret_name(job: JobSpec) -> str:
    """The Secret holding the job's env-server token (key `token`): `<app>-env-token`."""
    return f"{app_name(job)}-env-token"


def env_token_command(job: JobSpec) -> str | None:
    """The `kubectl create secret` line that makes the env-token Secret with a fresh random token, or None when the
    job has no env servers."""
    if not job.env_servers:
        return None
    cfg = job.kubernetes or KubernetesConfig()
    return (
        f"kubectl -n {cfg.namespace} create secret generic {env_token_secret_name(job)} \\\n"
        f'    --from-literal={ENV_TOKEN_KEY}="$(openssl rand -hex 32)"'
    )


def env_token_pools(job: JobSpec) -> set[str]:
    """The pools whose workers open sessions on one of the job's env servers (`network.env_server_callers`): the
    pods that present the token. No other pool gets it."""
    return {pool for server in job.env_servers for pool in env_server_callers(job, server)}


def env_token(
    job: JobSpec, env: list[dict[str, Any]], mounts: list[dict[str, Any]], volumes: list[dict[str, Any]]
) -> None:
    """The env-token Secret in a pod (an env server, or a pool in `env_token_pools`): its key as a file at
    ENV_TOKEN_PATH (read-only, private to the image's group), named to the process by `$ROLLART_ENV_SERVER_TOKEN_FILE`
    (a path, not the token: the token is in no environment and no pod spec).

    Rendered and required rather than refused at render: whether the Secret exists is not the job's to know (like
    the Temporal one), and an env server must never start without it. The volume is not optional, so the kubelet
    does not start a pod before the Secret exists, and a server whose file is empty refuses to start
    (`infra.env_server_token`): no path ends in a server that serves everyone.
    """
    env.append({"name": TOKEN_FILE_ENV, "value": ENV_TOKEN_PATH})
    mounts.append({"name": "env-token", "mountPath": ENV_TOKEN_MOUNT, "readOnly": True})
    volumes.append(
        {
            "name": "env-token",
            "secret": {
                "secretName": env_token_secret_name(job),
                "items": [{"key": ENV_TOKEN_KEY, "path": ENV_TOKEN_KEY}],
                "defaultMode": 0o440,
            },
        }
    )
