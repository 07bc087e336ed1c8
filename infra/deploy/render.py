"""Kubernetes manifests for a job: a Deployment per pool pinned to its GPU product, the trainer's ranks, the autoscaler.

Pure functions from a validated `JobSpec` to plain dicts (one small function per kind, in the modules beside
this one), so the output can be inspected, validated and diffed before anything touches a cluster;
`infra.deploy.apply` sends them. What gets rendered:

- a Namespace and a ConfigMap holding the job spec as the pods see it (the cluster's Temporal
  address, the store on the shared volume), mounted at `/etc/rollart/job.yaml` in every pod;
- PersistentVolumeClaims: the shared store (every worker) and the trainer's run dir;
- a Deployment per declared pool with workers (the job's `pools:`), running `rollart worker --pool P --job ...
  --temporal-address A` (`workloads`);
- for each reward pool (`serverless`): a KEDA `ScaledObject` on the pool's Temporal queue backlog, or a CPU-based
  HorizontalPodAutoscaler where KEDA is absent (`kubernetes.serverless.keda: false`) (`scaling`);
- the trainer as a StatefulSet of `pools.trainer.replicas` nodes and a headless Service (`trainer`);
- each of the job's `env_servers` as a Deployment and a ClusterIP Service (`env_servers`);
- with `temporal.tls`, `temporal.api_key_env` or `temporal.api_key_file`: the pods mount the TLS files and the API
  key as files from a Secret (the job's paths rewritten to the mount, the key's as `api_key_file`); KEDA gets them
  through a TriggerAuthentication. The Secret is not rendered (its contents are not the job's): `secret_command`
  says how to create it (`security`, `scaling`);
- with `env_servers`: the env-token Secret `<app>-env-token` mounted as a file in the env servers' pods and the pods
  of the pools that call them, which present it (not rendered either: `env_token_command`) (`security`);
- NetworkPolicies: ingress to the job's pods denied but from the pods that call them (env servers, trainer nodes,
  with a Mooncake store the pools and Mooncake's pods) (`network`);
- every pod under the "restricted" Pod Security Standard, read-only root, emptyDirs where it writes
  (`pod_security`);
- with a local store: a CronJob running `rollart store gc` on `kubernetes.store_gc_schedule` (`store_gc`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml

from rollart.infra.deploy.env_servers import env_server_deployment, env_server_service, env_server_url
from rollart.infra.deploy.names import K8sRenderError, Manifest, app_name, object_meta
from rollart.infra.deploy.network import network_policies
from rollart.infra.deploy.scaling import scaled_object, serverless_hpa, temporal_trigger_auth
from rollart.infra.deploy.security import API_KEY_PATH, SECRET_KEYS, TEMPORAL_MOUNT
from rollart.infra.deploy.store_gc import store_gc_cronjob
from rollart.infra.deploy.trainer import trainer_service, trainer_statefulset
from rollart.infra.deploy.workloads import pool_deployment
from rollart.spec.config import JobSpec
from rollart.spec.config.kubernetes import DEFAULT_TEMPORAL_ADDRESS, KubernetesConfig, ResolvedPool
from rollart.spec.pools import Pool

__all__ = [
    "cluster_job",
    "job_configmap",
    "namespace_manifest",
    "render",
    "resolved_pools",
    "temporal_address",
    "volume_claim",
    "write_manifests",
]

_LOCAL_HOSTS = ("127.", "localhost", "0.0.0.0", "[::1]", "::1")


def render(job: JobSpec) -> list[Manifest]:
    """Every object of the job's deployment, in the order they should be applied."""
    cfg = job.kubernetes or KubernetesConfig()
    problems = cfg.problems(job.needs())
    if problems:
        raise K8sRenderError("kubernetes: " + "; ".join(problems))
    app = app_name(job)
    address = temporal_address(job)
    spec_yaml = _job_yaml(cluster_job(job))
    pools = resolved_pools(job)
    manifests = [namespace_manifest(cfg), job_configmap(app, cfg, spec_yaml), *network_policies(job, pools)]
    if job.store.kind == "local":
        manifests.append(volume_claim(f"{app}-store", app, cfg, cfg.store_volume))
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
    gc = store_gc_cronjob(job, address)
    return [*manifests, gc] if gc is not None else manifests


def resolved_pools(job: JobSpec) -> dict[str, ResolvedPool]:
    """Each declared pool's concrete settings; generation pools no task uses get 0 replicas unless the job says
    otherwise."""
    return (job.kubernetes or KubernetesConfig()).resolve(job.needs())


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
    if job.temporal.has_api_key:  # the key too, as a file: in no process's environment
        key = {"api_key_env": None, "api_key_file": Path(API_KEY_PATH)}
        updates["temporal"] = updates["temporal"].model_copy(update=key)
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
        "metadata": object_meta(f"{app}-job", app, cfg),
        "data": {"job.yaml": spec_yaml},
    }


def volume_claim(name: str, app: str, cfg: KubernetesConfig, volume: Any) -> Manifest:
    """A PersistentVolumeClaim; the store's must be ReadWriteMany when workers run on several nodes."""
    spec: dict[str, Any] = {"accessModes": [volume.access_mode], "resources": {"requests": {"storage": volume.size}}}
    if volume.storage_class:
        spec["storageClassName"] = volume.storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": object_meta(name, app, cfg), "spec": spec}


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
