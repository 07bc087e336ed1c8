"""Who may connect to a job's pods on Kubernetes: the NetworkPolicies `rollart k8s render` emits for every store kind.

Every policy is validated with kubernetes-validate (Kubernetes 1.30, offline), and what it allows is read off its
selectors and ports the way the API server would: a pod is let in on a port when some policy selecting the target
has a rule whose peer selects the pod and whose ports (none: all) hold the port.
"""

from __future__ import annotations

from typing import Any

import pytest

from rollart.infra.deploy.names import Manifest
from rollart.infra.deploy.render import render
from rollart.spec.config import JobSpec, load_job
from tests.support.k8s import EXAMPLES, by_kind, megatron_job, validate_all
from tests.support.paths import REPO

STORES: dict[str, dict[str, Any]] = {
    "local": {"kind": "local"},
    "mooncake": {"kind": "mooncake", "mooncake": {"master": "mooncake-master.rollart.svc.cluster.local:50051"}},
}
OPENENV = REPO / "examples" / "openenv.yaml"
MOONCAKE_POD = {"app.kubernetes.io/name": "mooncake", "app.kubernetes.io/component": "master"}
OTHER_APP = {"app": "something-else"}


def openenv_job(store: str, **sections: Any) -> JobSpec:
    return load_job(OPENENV, {"store": STORES[store], **sections})


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels, matchExpressions with In) picks a pod with `labels`."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        assert e["operator"] == "In", e
        if labels.get(e["key"]) not in e["values"]:
            return False
    return True


def pod_labels(manifests: list[Manifest]) -> dict[str, dict[str, str]]:
    """Each rendered workload's pod labels, by workload name (the CronJob's pods too)."""
    pods = {
        m["metadata"]["name"]: m["spec"]["template"]["metadata"]["labels"]
        for m in manifests
        if m["kind"] in ("Deployment", "StatefulSet")
    }
    for m in by_kind(manifests, "CronJob").values():
        pods[m["metadata"]["name"]] = m["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    return pods


def allowed(manifests: list[Manifest], source: dict[str, str], target: dict[str, str], port: int) -> bool:
    """Whether the policies let a pod labelled `source` (same namespace) connect to one labelled `target` on `port`.

    A pod no policy selects is open; a selected one takes only what some rule of a selecting policy allows.
    """
    policies = [m["spec"] for m in by_kind(manifests, "NetworkPolicy").values()]
    selecting = [p for p in policies if selects(p["podSelector"], target)]
    if not selecting:
        return True
    for p in selecting:
        assert p["policyTypes"] == ["Ingress"], p  # egress stays open
        for rule in p.get("ingress", []):
            ports = [r["port"] for r in rule.get("ports", [])]
            peers = [peer["podSelector"] for peer in rule["from"]]
            assert all(set(peer) == {"podSelector"} for peer in rule["from"])  # this namespace's pods only
            if any(selects(s, source) for s in peers) and (not ports or port in ports):
                return True
    return False


# ---------------------------------------------------------------- every store kind


@pytest.mark.parametrize("store", sorted(STORES))
def test_every_job_pod_is_denied_ingress_but_what_its_callers_need(store: str) -> None:
    manifests = render(openenv_job(store))
    validate_all(manifests)
    policies = by_kind(manifests, "NetworkPolicy")
    assert {"openenv-default-deny", "openenv-env-frozenlake-ingress"} <= set(policies)
    kinds = [m["kind"] for m in manifests]
    assert kinds.index("NetworkPolicy") < kinds.index("Deployment")  # in place before any pod starts
    deny = policies["openenv-default-deny"]["spec"]
    assert "ingress" not in deny and deny["policyTypes"] == ["Ingress"]
    pods = pod_labels(manifests)
    used = {"control", "cpu", "h800", "serverless", "trainer", "env-frozenlake"} | (
        {"store-gc"} if store == "local" else set()
    )
    assert set(pods) == {f"openenv-{p}" for p in used}  # h20 generates nothing here: 0 replicas, not rendered
    assert all(selects(deny["podSelector"], labels) for labels in pods.values())  # every pod of the job...
    assert not selects(deny["podSelector"], OTHER_APP)  # ...and no other app's
    assert not selects(deny["podSelector"], {**pods["openenv-control"], "app.kubernetes.io/instance": "other-job"})

    server, port = pods.pop("openenv-env-frozenlake"), 8300
    cpu = pods["openenv-cpu"]  # the pool where the task naming the server holds its env sessions
    assert allowed(manifests, cpu, server, port)
    assert not allowed(manifests, cpu, server, port + 1)  # its port only
    for name, labels in pods.items():  # no other pool of the job, nothing else
        if name != "openenv-cpu":
            assert not allowed(manifests, labels, server, port), name
    assert not allowed(manifests, OTHER_APP, server, port)
    assert not allowed(manifests, MOONCAKE_POD, server, port)
    # the pools and the trainer (one node) take no connection from another app, on any port
    for name, labels in pods.items():
        assert not allowed(manifests, OTHER_APP, labels, 29500), name
        assert not allowed(manifests, server, labels, 1234), name


def test_with_mooncake_the_pools_and_mooncakes_pods_reach_each_other_and_nobody_else() -> None:
    manifests = render(openenv_job("mooncake"))
    pods = pod_labels(manifests)
    server = pods.pop("openenv-env-frozenlake")
    for target in [*pods.values(), MOONCAKE_POD]:  # every port: the transfer engines pick theirs at random
        for source in [*pods.values(), MOONCAKE_POD]:
            assert allowed(manifests, source, target, 15000), (source, target)
        assert not allowed(manifests, OTHER_APP, target, 15000)
        assert not allowed(manifests, server, target, 15000)  # an env server holds no store
    not_mooncake = {**MOONCAKE_POD, "app.kubernetes.io/name": "other"}
    assert not allowed(manifests, not_mooncake, pods["openenv-h800"], 15000)


def test_a_local_store_has_no_mooncake_policy_and_nothing_talks_pool_to_pool() -> None:
    manifests = render(openenv_job("local"))
    assert not [n for n in by_kind(manifests, "NetworkPolicy") if n.endswith(("-mooncake-ingress", "-pools-ingress"))]
    pods = pod_labels(manifests)
    assert not allowed(manifests, pods["openenv-h800"], pods["openenv-trainer"], 29500)
    assert not allowed(manifests, pods["openenv-trainer"], pods["openenv-h800"], 8000)


def test_a_multi_node_trainer_lets_in_its_own_nodes_only() -> None:
    manifests = render(megatron_job(2, 2, {"pools": {"trainer": {"replicas": 2}}}))
    validate_all(manifests)
    policy = by_kind(manifests, "NetworkPolicy")["frozenlake-trainer-ingress"]["spec"]
    pods = pod_labels(manifests)
    trainer = pods.pop("frozenlake-trainer")
    assert policy["podSelector"] == {
        "matchLabels": {"app.kubernetes.io/instance": "frozenlake", "app.kubernetes.io/component": "trainer"}
    }
    for port in (29500, 41234):  # the rendezvous, and NCCL/gloo's own ports
        assert allowed(manifests, trainer, trainer, port)
        assert not allowed(manifests, OTHER_APP, trainer, port)
        for name, labels in pods.items():
            assert not allowed(manifests, labels, trainer, port), name
    single = render(load_job(EXAMPLES["frozenlake"]))  # one node meets itself over loopback: no rule
    assert "frozenlake-trainer-ingress" not in by_kind(single, "NetworkPolicy")


def test_an_env_server_no_task_names_is_reachable_by_nobody() -> None:
    raw_servers = [{"name": "frozenlake", "env": "frozenlake", "port": 8300}, {"name": "spare", "port": 8400}]
    manifests = render(load_job(OPENENV, {"env_servers": raw_servers}))
    policies = by_kind(manifests, "NetworkPolicy")
    assert "openenv-env-spare-ingress" not in policies and "openenv-env-frozenlake-ingress" in policies
    pods = pod_labels(manifests)
    assert not allowed(manifests, pods["openenv-cpu"], pods["openenv-env-spare"], 8400)


def test_an_env_server_is_reached_from_the_pool_its_tasks_put_their_env_on() -> None:
    job = load_job(OPENENV, {"tasks": [{**load_job(OPENENV).tasks[0].model_dump(mode="json"), "env_pool": "h800"}]})
    manifests = render(job)
    pods = pod_labels(manifests)
    server = pods["openenv-env-frozenlake"]
    assert allowed(manifests, pods["openenv-h800"], server, 8300)
    assert not allowed(manifests, pods["openenv-cpu"], server, 8300)


@pytest.mark.parametrize("store", sorted(STORES))
def test_the_policies_can_be_left_out_but_mooncakes_keep_their_own_switch(store: str) -> None:
    manifests = render(openenv_job(store, kubernetes={"network_policies": False}))
    names = set(by_kind(manifests, "NetworkPolicy"))
    assert names == ({"openenv-mooncake-ingress", "openenv-pools-ingress"} if store == "mooncake" else set())
