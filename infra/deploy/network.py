"""Who may connect to a job's pods: NetworkPolicies that deny ingress to all of them, then allow what the code does.

What listens in a job's pods, and who calls it (the only pod-to-pod traffic there is; workers only dial out, to
Temporal and the store):

- an env server (`rollart env-server`, OpenEnv WebSockets that want the job's token) on its port: the workers of the
  pools where the tasks naming it (`env: openenv`, `env_args.server`) hold their env sessions (`TaskSpec.env_queue`);
- trainer node 0's rendezvous TCPStore (`kubernetes.rdzv_port`) and the ranks' NCCL/gloo sockets, on ports those
  pick: the other trainer nodes, with several nodes (one node talks to itself over loopback);
- with a Mooncake store, every process's transfer engine (random ports) and the Mooncake master's and keeper's
  listeners: the pools' pods and the Mooncake pods (`kubernetes.mooncake.pod_labels`);
- an env worker's agent endpoint binds loopback (`ROLLART_AGENT_HOST`), which no pod renders otherwise: no rule.

Egress stays open: Temporal, the Mooncake master and model downloads are outside the job, at addresses the job
does not know. The kubelet's probes are not affected (traffic from a pod's node is always allowed).
"""

from __future__ import annotations

from typing import Any

from rollart.infra.deploy.names import Manifest, app_labels, app_name, object_meta, pools_selector
from rollart.spec.config import OPENENV, EnvServerSpec, JobSpec
from rollart.spec.config.kubernetes import KubernetesConfig, ResolvedPool
from rollart.spec.pools import Pool

__all__ = [
    "env_server_callers",
    "job_pods_selector",
    "mooncake_network_policies",
    "network_policies",
]


def network_policies(job: JobSpec, pools: dict[str, ResolvedPool]) -> list[Manifest]:
    """Every NetworkPolicy of the job: default deny, the env servers', the trainer's, Mooncake's.

    `kubernetes.network_policies: false` leaves out all but Mooncake's (`kubernetes.mooncake.network_policy`).
    """
    cfg = job.kubernetes or KubernetesConfig()
    if not cfg.network_policies:
        return mooncake_network_policies(job)
    app = app_name(job)
    manifests = [_policy(f"{app}-default-deny", app, cfg, job_pods_selector(app), [])]
    for server in job.env_servers:
        callers = env_server_callers(job, server)
        if callers:  # a server no task names is called by nobody: the default denies it all
            labels = _component(app, f"env-{server.name}")
            port = {"protocol": "TCP", "port": server.port}
            rule = {"from": [{"podSelector": pools_selector(app, callers)}], "ports": [port]}
            manifests.append(_policy(f"{app}-env-{server.name}-ingress", app, cfg, labels, [rule]))
    trainer = pools.get(Pool.TRAINER.value)
    if trainer is not None and trainer.replicas > 1:  # NCCL and gloo pick their ports: every port, peers only
        peers = _component(app, Pool.TRAINER.value)
        rule = {"from": [{"podSelector": peers}]}
        manifests.append(_policy(f"{app}-trainer-ingress", app, cfg, peers, [rule]))
    return [*manifests, *mooncake_network_policies(job)]


def job_pods_selector(app: str) -> dict[str, Any]:
    """Every pod the job renders (pools, trainer, env servers, the store's sweeps), and no other app's."""
    labels = app_labels(app)
    return {"matchLabels": {k: labels[k] for k in ("app.kubernetes.io/name", "app.kubernetes.io/instance")}}


def env_server_callers(job: JobSpec, server: EnvServerSpec) -> list[str]:
    """The pools whose workers open sessions on `server`: those of the tasks naming it, in the job's pool order."""
    used = {t.env_queue for t in job.tasks if t.env == OPENENV and t.env_args.get("server") == server.name}
    return [pool for pool in job.pools if pool in used]


def mooncake_network_policies(job: JobSpec) -> list[Manifest]:
    """With a Mooncake store: only the job's pool pods (and the Mooncake pods) may reach the Mooncake master and
    keeper pods (`kubernetes.mooncake.pod_labels`) or the pool pods themselves, whose transfer engines listen on
    every interface. None with a local store or `kubernetes.mooncake.network_policy: false`."""
    cfg = job.kubernetes or KubernetesConfig()
    if job.store.kind != "mooncake" or not cfg.mooncake.network_policy:
        return []
    app = app_name(job)
    mooncake = {"matchLabels": dict(cfg.mooncake.pod_labels)}
    pool_pods = pools_selector(app, list(job.pools))
    rule = {"from": [{"podSelector": pool_pods}, {"podSelector": mooncake}]}
    return [
        _policy(f"{app}-mooncake-ingress", app, cfg, mooncake, [rule]),
        _policy(f"{app}-pools-ingress", app, cfg, pool_pods, [rule]),
    ]


def _component(app: str, component: str) -> dict[str, Any]:
    return {"matchLabels": {"app.kubernetes.io/instance": app, "app.kubernetes.io/component": component}}


def _policy(
    name: str, app: str, cfg: KubernetesConfig, selector: dict[str, Any], ingress: list[dict[str, Any]]
) -> Manifest:
    """An ingress policy on the pods `selector` picks in the job's namespace; no rules denies them all ingress."""
    spec: dict[str, Any] = {"podSelector": selector, "policyTypes": ["Ingress"]}
    if ingress:
        spec["ingress"] = ingress
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_meta(name, app, cfg),
        "spec": spec,
    }
