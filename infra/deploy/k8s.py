"""Kubernetes manifests for a job: a Deployment per pool pinned to its GPU product, the trainer's ranks, the autoscaler.

Pure functions from a validated `JobSpec` to plain dicts (one small function per kind), so the
output can be inspected, validated and diffed before anything touches a cluster; `k8s_apply`
sends them. What gets rendered:

- a Namespace and a ConfigMap holding the job spec as the pods see it (the cluster's Temporal
  address, the store on the shared volume), mounted at `/etc/rollart/job.yaml` in every pod;
- PersistentVolumeClaims: the shared store (every worker) and the trainer's run dir;
- a Deployment per declared pool with workers (the job's `pools:`), running `rollart worker --pool P --job ...
  --temporal-address A`, GPU pools (`gpu:` declared) with a node selector on `gpu.product`, the GPU taint
  tolerated, and `gpu.count` GPUs, else as many worker uses (a generation worker:
  `engine.tensor_parallel_size`); pools on GPUs run the GPU image, the others the CPU image;
- for each reward pool (`serverless`): a KEDA `ScaledObject` on the pool's Temporal queue backlog, or a CPU-based
  HorizontalPodAutoscaler where KEDA is absent (`kubernetes.serverless.keda: false`);
- the trainer as a StatefulSet of `pools.trainer.replicas` nodes (one GPU per trainer rank) and a
  headless Service: pod k is node rank k, and every node meets node 0 (pod 0) at its stable DNS
  name. A StatefulSet never runs two pods of one identity, so no rank is ever trained twice over;
- each of the job's `env_servers` (an OpenEnv server, `rollart env-server`) as a Deployment and a
  ClusterIP Service; the job's `openenv` tasks are pointed at the Service;
- with `temporal.tls` or `temporal.api_key_env`: the pods mount the TLS files from a Secret (the job's paths
  rewritten to the mount) and take the API key from it into `api_key_env`'s variable; KEDA gets them through a
  TriggerAuthentication. The Secret is not rendered (its contents are not the job's): `secret_command` says
  how to create it;
- with a Mooncake store: NetworkPolicies that let only the pools' pods reach the Mooncake master and keeper pods
  and the pools' own transfer-engine listeners.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from rollart.infra.config import EnvServerSpec, JobSpec, TemporalConfig
from rollart.infra.deploy.layout import DEFAULT_TEMPORAL_ADDRESS, KubernetesConfig, ResolvedPool
from rollart.infra.pools import Pool

__all__ = [
    "IMAGE_GID",
    "JOB_MOUNT",
    "TEMPORAL_MOUNT",
    "K8sRenderError",
    "app_name",
    "cluster_job",
    "env_server_deployment",
    "env_server_service",
    "env_server_url",
    "job_configmap",
    "mooncake_network_policies",
    "namespace_manifest",
    "pool_deployment",
    "render",
    "rendezvous_address",
    "resolved_pools",
    "scaled_object",
    "secret_command",
    "serverless_hpa",
    "temporal_address",
    "temporal_secret_name",
    "temporal_trigger_auth",
    "trainer_service",
    "trainer_statefulset",
    "volume_claim",
    "write_manifests",
]

JOB_MOUNT = "/etc/rollart"
"""Where the job ConfigMap is mounted; the spec itself is `JOB_MOUNT/job.yaml`."""

TEMPORAL_MOUNT = "/etc/rollart-temporal"
"""Where the Temporal Secret's TLS files are mounted (beside, not inside, the read-only job mount)."""

SECRET_KEYS = {"ca": "ca.crt", "cert": "tls.crt", "key": "tls.key"}
"""The Temporal Secret's key for each `temporal.tls` file; the API key is under `API_KEY_KEY`."""

API_KEY_KEY = "api-key"

IMAGE_GID = 10001
"""The group of the `rollart` user the images run as (docker/Dockerfile.*): pods mount volumes writable for it."""

Manifest = dict[str, Any]

_LOCAL_HOSTS = ("127.", "localhost", "0.0.0.0", "[::1]", "::1")
_POD_INDEX_FIELD = "metadata.labels['apps.kubernetes.io/pod-index']"  # set on StatefulSet pods (Kubernetes 1.28+)
_GENERATION_GRACE_S = 90  # generation workers drain for up to 60 s (graceful_shutdown_timeout) before exiting


class K8sRenderError(ValueError):
    """The job cannot be laid out on a cluster as configured; the message says what to change."""


def render(job: JobSpec) -> list[Manifest]:
    """Every object of the job's deployment, in the order they should be applied."""
    cfg = job.kubernetes or KubernetesConfig()
    problems = cfg.problems(job.needs())
    if problems:
        raise K8sRenderError("kubernetes: " + "; ".join(problems))
    app = app_name(job)
    address = temporal_address(job)
    spec_yaml = _job_yaml(cluster_job(job))
    manifests = [namespace_manifest(cfg), job_configmap(app, cfg, spec_yaml), *mooncake_network_policies(job)]
    if job.store.kind == "local":
        manifests.append(volume_claim(f"{app}-store", app, cfg, cfg.store_volume))
    pools = resolved_pools(job)
    if pools[Pool.TRAINER].replicas:
        manifests.append(volume_claim(f"{app}-runs", app, cfg, cfg.runs_claim()))
    digest = hashlib.sha256(spec_yaml.encode()).hexdigest()[:16]
    for resolved in pools.values():
        if not resolved.replicas:
            continue
        if resolved.role == "trainer":
            manifests += [trainer_service(job), trainer_statefulset(job, resolved, address, digest)]
        else:
            manifests.append(pool_deployment(job, resolved, address, digest))
    elastic = [name for name, resolved in pools.items() if resolved.role == "reward" and resolved.replicas]
    if elastic and cfg.serverless.keda:
        auth = temporal_trigger_auth(job)
        manifests += [auth] if auth else []
        secured = job.temporal if auth else None
        manifests += [scaled_object(app, cfg, address, job.temporal.namespace, secured, pool) for pool in elastic]
    else:
        manifests += [serverless_hpa(app, cfg, address, job.temporal.namespace, pool) for pool in elastic]
    for server in job.env_servers:
        manifests += [env_server_service(job, server), env_server_deployment(job, server)]
    return manifests


def resolved_pools(job: JobSpec) -> dict[str, ResolvedPool]:
    """Each declared pool's concrete settings; generation pools no task uses get 0 replicas unless the job says
    otherwise."""
    return (job.kubernetes or KubernetesConfig()).resolve(job.needs())


def app_name(job: JobSpec) -> str:
    """Prefix of every object's name: `kubernetes.name`, else the job name made DNS-safe."""
    cfg = job.kubernetes or KubernetesConfig()
    if cfg.name:
        return cfg.name
    name = re.sub(r"[^a-z0-9-]+", "-", job.name.lower()).strip("-")[:40].strip("-")
    return name or "rollart"


def temporal_address(job: JobSpec) -> str:
    """The Temporal frontend the pods dial: `kubernetes.temporal_address`, `temporal.address`, or the Helm default."""
    cfg = job.kubernetes or KubernetesConfig()
    address = cfg.temporal_address or job.temporal.address or DEFAULT_TEMPORAL_ADDRESS
    if address.startswith(_LOCAL_HOSTS):
        source = "kubernetes.temporal_address" if cfg.temporal_address else "temporal.address"
        raise K8sRenderError(
            f"Temporal address {address!r} (from {source}) is the local machine, which pods cannot reach: set "
            "kubernetes.temporal_address (or pass --temporal-address) to the cluster's Temporal frontend, "
            f"e.g. {DEFAULT_TEMPORAL_ADDRESS}"
        )
    return address


def cluster_job(job: JobSpec) -> JobSpec:
    """The job as the pods read it: the cluster's Temporal address, a local store on the shared volume."""
    cfg = job.kubernetes or KubernetesConfig()
    updates: dict[str, Any] = {
        "temporal": job.temporal.model_copy(update={"address": temporal_address(job)}),
        "kubernetes": None,
    }
    if job.temporal.tls is not None:  # the files are where the pods mount the Secret
        files = {field: Path(f"{TEMPORAL_MOUNT}/{SECRET_KEYS[field]}") for field in job.temporal.tls.files()}
        updates["temporal"] = updates["temporal"].model_copy(update={"tls": job.temporal.tls.model_copy(update=files)})
    if job.store.kind == "local":
        updates["store"] = job.store.model_copy(update={"path": Path(cfg.store_mount)})
    urls = {server.name: env_server_url(job, server) for server in job.env_servers}
    return job.with_env_server_urls(urls).model_copy(update=updates)


def namespace_manifest(cfg: KubernetesConfig) -> Manifest:
    """The namespace every other object lives in."""
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": cfg.namespace}}


def job_configmap(app: str, cfg: KubernetesConfig, spec_yaml: str) -> Manifest:
    """The job spec, mounted read-only into every pod: one source of truth for all workers."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(f"{app}-job", app, cfg),
        "data": {"job.yaml": spec_yaml},
    }


def volume_claim(name: str, app: str, cfg: KubernetesConfig, volume: Any) -> Manifest:
    """A PersistentVolumeClaim; the store's must be ReadWriteMany when workers run on several nodes."""
    spec: dict[str, Any] = {"accessModes": [volume.access_mode], "resources": {"requests": {"storage": volume.size}}}
    if volume.storage_class:
        spec["storageClassName"] = volume.storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": _meta(name, app, cfg), "spec": spec}


def pool_deployment(job: JobSpec, pool: ResolvedPool, address: str, job_digest: str) -> Manifest:
    """One pool's workers: `rollart worker --pool P` on nodes of the pool's kind, with its resources."""
    if pool.role == "trainer":
        raise ValueError("the trainer is a StatefulSet: use trainer_statefulset")
    cfg = job.kubernetes or KubernetesConfig()
    app = app_name(job)
    name = f"{app}-{pool.pool}"
    labels = _labels(app, pool.pool)
    spec: dict[str, Any] = {}
    if pool.role != "reward":  # a reward pool's replicas belong to its autoscaler
        spec["replicas"] = pool.replicas
    if pool.role == "generation":  # GPUs are scarce: replace in place rather than surge
        spec["strategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    spec["selector"] = _selector(labels)
    spec["template"] = {
        "metadata": {"labels": labels, "annotations": {"rollart.dev/job-sha256": job_digest}},
        "spec": _pod_spec(job, cfg, app, pool, address),
    }
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(name, app, cfg, pool.pool), "spec": spec}


def trainer_service(job: JobSpec) -> Manifest:
    """The trainer's headless Service: gives each trainer pod a stable DNS name, pod 0's being the rendezvous.

    Addresses are published before the pods are ready, so the nodes can meet while they start up.
    """
    cfg = job.kubernetes or KubernetesConfig()
    app = app_name(job)
    labels = _labels(app, Pool.TRAINER)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(_trainer_name(app), app, cfg, Pool.TRAINER),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": _selector(labels)["matchLabels"],
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
    labels = _labels(app, Pool.TRAINER)
    spec: dict[str, Any] = {
        "serviceName": _trainer_name(app),
        "replicas": pool.replicas,
        "podManagementPolicy": "Parallel",
        "selector": _selector(labels),
        "template": {
            "metadata": {"labels": labels, "annotations": {"rollart.dev/job-sha256": job_digest}},
            "spec": _pod_spec(job, cfg, app, pool, address),
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(_trainer_name(app), app, cfg, Pool.TRAINER),
        "spec": spec,
    }


def rendezvous_address(job: JobSpec) -> str:
    """Trainer node 0's HOST:PORT as every trainer pod reaches it: pod 0's name under the headless Service."""
    cfg = job.kubernetes or KubernetesConfig()
    app = app_name(job)
    return f"{_trainer_name(app)}-0.{_trainer_name(app)}.{cfg.namespace}.svc.cluster.local:{cfg.rdzv_port}"


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
        "metadata": _meta(f"{app}-{pool}", app, cfg, pool),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": f"{app}-{pool}"},
            "minReplicaCount": s.min_replicas,
            "maxReplicaCount": s.max_replicas,
            "pollingInterval": s.polling_interval_s,
            "cooldownPeriod": s.cooldown_period_s,
            "triggers": [trigger],
        },
    }


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


def temporal_trigger_auth(job: JobSpec) -> Manifest | None:
    """KEDA's credentials for the job's Temporal server, from the Temporal Secret; None when the job uses none.

    KEDA's temporal scaler speaks TLS only with an API key (and then trusts only the system's roots) or with a
    client certificate (and then the CA given): other secured layouts could not scale, so they are refused.
    """
    t = job.temporal
    if not t.secured:
        return None
    files = t.tls.files() if t.tls is not None else {}
    if "cert" not in files and not t.api_key_env:
        raise K8sRenderError(
            "KEDA's temporal scaler uses TLS only with a client certificate or an API key, and the job has "
            "temporal.tls without either: scale serverless with the CPU HPA (kubernetes.serverless.keda: false, "
            "or --hpa), or give the scaler credentials (temporal.tls.cert/key or temporal.api_key_env)"
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
    if t.api_key_env:
        refs.append({"parameter": "apiKey", "name": secret, "key": API_KEY_KEY})
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "TriggerAuthentication",
        "metadata": _meta(_trigger_auth_name(app), app, cfg, Pool.SERVERLESS),
        "spec": {"secretTargetRef": refs},
    }


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
        peers = [{"podSelector": _pools_selector(app, list(job.pools))}, {"podSelector": mooncake()}]
        return {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": _meta(name, app, cfg),
            "spec": {"podSelector": selector, "policyTypes": ["Ingress"], "ingress": [{"from": peers}]},
        }

    pool_pods = _pools_selector(app, list(job.pools))
    return [policy(f"{app}-mooncake-ingress", mooncake()), policy(f"{app}-pools-ingress", pool_pods)]


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
        "metadata": _meta(name, app, cfg, pool),
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
            "selector": _selector(labels)["matchLabels"],
            "ports": [{"name": "http", "port": server.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def env_server_deployment(job: JobSpec, server: EnvServerSpec) -> Manifest:
    """An env server's pod: `rollart env-server` on the CPU image, ready (and alive) while `/health` answers.

    It needs neither the job nor the store: its command line says what it serves. A pod that dies takes its
    sessions with it; the episodes are restored on a fresh session (replayed), through the Service.
    """
    cfg = job.kubernetes or KubernetesConfig()
    app = app_name(job)
    name = _env_server_name(job, server)
    labels = _env_server_labels(app, server)

    def probe(**timing: int) -> dict[str, Any]:
        return {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5, **timing}

    container = {
        "name": "env-server",
        "image": cfg.image,
        "imagePullPolicy": cfg.image_pull_policy,
        "command": server.command("0.0.0.0"),
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
        "ports": [{"name": "http", "containerPort": server.port, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1Gi"}},
        "readinessProbe": probe(initialDelaySeconds=2),
        "livenessProbe": probe(initialDelaySeconds=30, failureThreshold=6),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": cfg.namespace, "labels": dict(labels)},
        "spec": {
            "replicas": 1,
            "selector": _selector(labels),
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
        },
    }


def write_manifests(manifests: list[Manifest], out_dir: Path) -> list[Path]:
    """One YAML file per object, numbered in apply order (`kubectl apply -f DIR` takes them in that order)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, m in enumerate(manifests):
        path = out_dir / f"{i:02d}-{m['kind'].lower()}-{m['metadata']['name']}.yaml"
        path.write_text(yaml.dump(m, Dumper=_Dumper, sort_keys=False))
        paths.append(path)
    return paths


# ---------------------------------------------------------------- helpers


class _Dumper(yaml.SafeDumper):
    """Safe YAML with multi-line strings (the job spec in the ConfigMap) as readable `|` blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _job_yaml(job: JobSpec) -> str:
    return yaml.safe_dump(job.model_dump(mode="json", exclude={"kubernetes"}), sort_keys=False)


def _labels(app: str, pool: str | None = None) -> dict[str, str]:
    labels = {
        "app.kubernetes.io/name": "rollart",
        "app.kubernetes.io/instance": app,
        "app.kubernetes.io/managed-by": "rollart",
    }
    if pool is not None:
        labels["app.kubernetes.io/component"] = str(pool)  # a plain str (yaml.safe_dump refuses a Pool)
    return labels


def _meta(name: str, app: str, cfg: KubernetesConfig, pool: str | None = None) -> dict[str, Any]:
    return {"name": name, "namespace": cfg.namespace, "labels": _labels(app, pool)}


def _selector(labels: dict[str, str]) -> dict[str, Any]:
    """The labels that pick one pool's pods of one app (a workload's selector, the trainer Service's)."""
    return {"matchLabels": {k: labels[k] for k in ("app.kubernetes.io/instance", "app.kubernetes.io/component")}}


def _env_server_name(job: JobSpec, server: EnvServerSpec) -> str:
    name = f"{app_name(job)}-env-{server.name}"
    if len(name) > 63:  # a Service name is a DNS label
        raise K8sRenderError(
            f"env server {server.name!r}: its Service name {name!r} is over 63 characters; shorten "
            "env_servers[].name or set kubernetes.name"
        )
    return name


def _env_server_labels(app: str, server: EnvServerSpec) -> dict[str, str]:
    return {**_labels(app), "app.kubernetes.io/component": f"env-{server.name}"}


def _pools_selector(app: str, names: list[str]) -> dict[str, Any]:
    """Every pool's pods of one app (workers and trainer nodes of the pools `names`; not its env servers)."""
    pools = {"key": "app.kubernetes.io/component", "operator": "In", "values": names}
    return {"matchLabels": {"app.kubernetes.io/instance": app}, "matchExpressions": [pools]}


def _trigger_auth_name(app: str) -> str:
    return f"{app}-temporal"


def _trainer_name(app: str) -> str:
    return f"{app}-{Pool.TRAINER.value}"


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


def _pod_spec(job: JobSpec, cfg: KubernetesConfig, app: str, pool: ResolvedPool, address: str) -> dict[str, Any]:
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
    env: list[dict[str, Any]] = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    _temporal_credentials(job, mounts, volumes, env)
    container: dict[str, Any] = {
        "name": "worker",
        "image": cfg.gpu_image if pool.gpus else cfg.image,  # `gpus: 0` runs the pool on CPUs: the CPU build
        "imagePullPolicy": cfg.image_pull_policy,
        "command": _worker_command(job, pool, address),
        "env": env,
        "resources": {"requests": requests, "limits": limits},
        "volumeMounts": mounts,
    }
    if pool.role == "trainer":  # the pod's index in its StatefulSet is its node rank
        env.append({"name": "POD_INDEX", "valueFrom": {"fieldRef": {"fieldPath": _POD_INDEX_FIELD}}})
        container["ports"] = [{"name": "rdzv", "containerPort": cfg.rdzv_port, "protocol": "TCP"}]
    # the images run as a non-root user: volumes (store, run dir) are made group-writable for it, once
    # (OnRootMismatch: not a recursive walk of a large store at every pod start)
    security = {"fsGroup": IMAGE_GID, "fsGroupChangePolicy": "OnRootMismatch"}
    spec: dict[str, Any] = {"containers": [container], "volumes": volumes, "securityContext": security}
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


def _temporal_credentials(
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
