"""The job's `env_servers` on a cluster: each OpenEnv server (`rollart env-server`) as a Deployment and a ClusterIP
Service, and the Service's URL that the job's `openenv` tasks are pointed at."""

from __future__ import annotations

from typing import Any

from rollart.infra.deploy.names import K8sRenderError, Manifest, app_labels, app_name, pod_selector
from rollart.infra.deploy.pod_security import container_security_context, pod_security_context, scratch_volumes
from rollart.infra.deploy.security import env_token
from rollart.spec.config import EnvServerSpec, JobSpec
from rollart.spec.config.kubernetes import KubernetesConfig

__all__ = ["env_server_deployment", "env_server_service", "env_server_url"]


def env_server_url(job: JobSpec, server: EnvServerSpec) -> str:
    """How the workers reach env server `server` in the cluster: its Service's DNS name."""
    cfg = job.kubernetes or KubernetesConfig()
    return f"http://{_env_server_name(job, server)}.{cfg.namespace}.svc.cluster.local:{server.port}"


def env_server_service(job: JobSpec, server: EnvServerSpec) -> Manifest:
    """The ClusterIP Service in front of an env server: a session is one WebSocket, so one connection to one pod."""
    cfg = job.kubernetes or KubernetesConfig()
    app = app_name(job)
    labels = _env_server_labels(app, server)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": _env_server_name(job, server), "namespace": cfg.namespace, "labels": labels},
        "spec": {
            "selector": pod_selector(labels)["matchLabels"],
            "ports": [{"name": "http", "port": server.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def env_server_deployment(job: JobSpec, server: EnvServerSpec) -> Manifest:
    """An env server's pod: `rollart env-server` on the CPU image, ready (and alive) while `/health` answers.

    It needs neither the job nor the store: its command line says what it serves. A pod that dies takes its
    sessions with it; the episodes are restored on a fresh session (replayed), through the Service. It runs the
    env's code, so it gets `kubernetes.env_runtime_class` (e.g. gVisor) like the env pools. It serves only clients
    presenting the job's token, from the env-token Secret (`security.env_token`): it does not start without it.
    """
    cfg = job.kubernetes or KubernetesConfig()
    app = app_name(job)
    name = _env_server_name(job, server)
    labels = _env_server_labels(app, server)

    def probe(**timing: int) -> dict[str, Any]:
        return {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5, **timing}

    mounts: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []
    env: list[dict[str, Any]] = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    scratch_volumes(mounts, volumes)
    env_token(job, env, mounts, volumes)
    container = {
        "name": "env-server",
        "image": cfg.image,
        "imagePullPolicy": cfg.image_pull_policy,
        "command": server.command("0.0.0.0"),
        "env": env,
        "ports": [{"name": "http", "containerPort": server.port, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1Gi"}},
        "readinessProbe": probe(initialDelaySeconds=2),
        "livenessProbe": probe(initialDelaySeconds=30, failureThreshold=6),
        "volumeMounts": mounts,
        "securityContext": container_security_context(cfg),
    }
    pod: dict[str, Any] = {"containers": [container], "volumes": volumes, "securityContext": pod_security_context()}
    if cfg.env_runtime_class:
        pod["runtimeClassName"] = cfg.env_runtime_class
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": cfg.namespace, "labels": dict(labels)},
        "spec": {
            "replicas": 1,
            "selector": pod_selector(labels),
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def _env_server_name(job: JobSpec, server: EnvServerSpec) -> str:
    name = f"{app_name(job)}-env-{server.name}"
    if len(name) > 63:  # a Service name is a DNS label
        raise K8sRenderError(
            f"env server {server.name!r}: its Service name {name!r} is over 63 characters; shorten "
            "env_servers[].name or set kubernetes.name"
        )
    return name


def _env_server_labels(app: str, server: EnvServerSpec) -> dict[str, str]:
    return {**app_labels(app), "app.kubernetes.io/component": f"env-{server.name}"}
