"""Kubernetes manifests of a job: valid for a pinned Kubernetes, the job as the pods see it, serverless autoscaling,
bad input refused naming the field, the docs' examples, env servers.

Core objects are checked with kubernetes-validate against the schemas it ships for Kubernetes
1.30 (offline); the KEDA ScaledObject, a CRD, is checked structurally.
"""

from __future__ import annotations

import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from rollart.infra.deploy.names import K8sRenderError
from rollart.infra.deploy.render import render
from rollart.spec.config import JobSpec, JobSpecError, load_job
from rollart.spec.config.kubernetes import DEFAULT_CPU_IMAGE, KubernetesConfig
from rollart.spec.pools import Pool
from tests.support.k8s import (
    EXAMPLES,
    K8S_VERSION,
    by_kind,
    container,
    deployments_by_pool,
    megatron_job,
    pod,
    validate_all,
    with_kubernetes,
    workloads_by_pool,
    write_job,
)
from tests.support.paths import REPO

# ---------------------------------------------------------------- schema validity


@pytest.mark.parametrize("example", sorted(EXAMPLES))
@pytest.mark.parametrize("keda", [True, False])
def test_every_core_manifest_validates_against_kubernetes_1_30(example: str, keda: bool) -> None:
    job = with_kubernetes(load_job(EXAMPLES[example]), {"serverless": {"keda": keda}})
    manifests = render(job)
    kinds = {m["kind"] for m in manifests}
    assert {"Namespace", "ConfigMap", "PersistentVolumeClaim", "Deployment", "Service", "StatefulSet"} <= kinds
    assert ("ScaledObject" in kinds) is keda and ("HorizontalPodAutoscaler" in kinds) is not keda
    for m in manifests:
        if m["apiVersion"].startswith("keda.sh/"):
            continue  # a CRD: checked structurally below
        kubernetes_validate.validate(m, K8S_VERSION, strict=True)


def test_the_validator_rejects_a_broken_deployment() -> None:
    """Guards the test above against a validator that accepts anything."""
    deployment = next(iter(by_kind(render(load_job(EXAMPLES["frozenlake"])), "Deployment").values()))
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["replica"] = broken["spec"].pop("replicas")  # a typo: strict validation must catch it
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


# ---------------------------------------------------------------- the job in the pods


def test_the_configmap_holds_the_job_as_the_pods_see_it(tmp_path: Path) -> None:
    job = with_kubernetes(load_job(EXAMPLES["multitask"]), {"temporal_address": "temporal.prod.svc:7233"})
    manifests = render(job)
    (configmap,) = by_kind(manifests, "ConfigMap").values()
    path = tmp_path / "job.yaml"
    path.write_text(configmap["data"]["job.yaml"])
    in_pod = load_job(path)  # what `rollart worker --job /etc/rollart/job.yaml` reads
    assert in_pod.temporal.address == "temporal.prod.svc:7233"
    assert in_pod.store.path == Path("/var/lib/rollart/store")
    assert in_pod.tasks == job.tasks and in_pod.engine == job.engine and in_pod.kubernetes is None
    for d in workloads_by_pool(manifests).values():
        assert {"name": "job", "configMap": {"name": configmap["metadata"]["name"]}} in pod(d)["volumes"]


def test_a_cronjob_sweeps_the_stores_claims_daily_against_the_jobs_temporal() -> None:
    """`rollart store gc` as a CronJob: the job spec and the store volume every worker has, the cluster's Temporal;
    a schedule of the user's, or none at all."""
    job = with_kubernetes(load_job(EXAMPLES["frozenlake"]), {"temporal_address": "temporal.prod.svc:7233"})
    manifests = render(job)
    (cron,) = by_kind(manifests, "CronJob").values()
    assert cron["spec"]["schedule"] == "17 3 * * *" and cron["spec"]["concurrencyPolicy"] == "Forbid"
    spec = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert c["command"] == [
        "rollart", "store", "gc", "--job", "/etc/rollart/job.yaml", "--temporal-address", "temporal.prod.svc:7233"
    ]  # fmt: skip
    claims = {v["name"]: v for v in spec["volumes"]}
    assert claims["store"]["persistentVolumeClaim"]["claimName"] in by_kind(manifests, "PersistentVolumeClaim")
    assert claims["job"]["configMap"]["name"] in by_kind(manifests, "ConfigMap")
    assert manifests[-1] is cron  # after everything it reads
    validate_all([cron])
    hourly = with_kubernetes(load_job(EXAMPLES["frozenlake"]), {"store_gc_schedule": "0 * * * *"})
    assert next(iter(by_kind(render(hourly), "CronJob").values()))["spec"]["schedule"] == "0 * * * *"
    never = with_kubernetes(load_job(EXAMPLES["frozenlake"]), {"store_gc_schedule": None})
    assert not by_kind(render(never), "CronJob")


# ---------------------------------------------------------------- serverless autoscaling


def test_keda_scales_the_serverless_deployment_on_its_temporal_backlog() -> None:
    section = {
        "temporal_address": "temporal.prod.svc:7233",
        "serverless": {"min_replicas": 1, "max_replicas": 32, "target_queue_size": 5},
    }
    job = with_kubernetes(load_job(EXAMPLES["multitask"]), section)
    manifests = render(job)
    (so,) = by_kind(manifests, "ScaledObject").values()
    assert so["apiVersion"] == "keda.sh/v1alpha1" and so["metadata"]["namespace"] == "rollart"
    spec = so["spec"]
    target = spec["scaleTargetRef"]
    assert target["kind"] == "Deployment" and target["name"] in by_kind(manifests, "Deployment")
    assert deployments_by_pool(manifests)["serverless"]["metadata"]["name"] == target["name"]
    assert "replicas" not in by_kind(manifests, "Deployment")[target["name"]]["spec"]  # KEDA owns the count
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 32)
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "temporal"
    meta = trigger["metadata"]
    assert meta["taskQueue"] == Pool.SERVERLESS.value and meta["queueTypes"] == "activity"
    assert meta["endpoint"] == "temporal.prod.svc:7233" and meta["namespace"] == job.temporal.namespace
    assert meta["targetQueueSize"] == "5" and meta["activationTargetQueueSize"] == "0"
    assert all(isinstance(v, str) for v in meta.values())  # KEDA's trigger metadata is map[string]string
    assert set(spec) <= {
        "scaleTargetRef",
        "minReplicaCount",
        "maxReplicaCount",
        "pollingInterval",
        "cooldownPeriod",
        "triggers",
        "advanced",
        "fallback",
        "idleReplicaCount",
    }


def test_without_keda_a_cpu_hpa_scales_serverless_from_at_least_one() -> None:
    job = with_kubernetes(load_job(EXAMPLES["frozenlake"]), {"serverless": {"keda": False, "max_replicas": 6}})
    manifests = render(job)
    assert not by_kind(manifests, "ScaledObject")
    (hpa,) = by_kind(manifests, "HorizontalPodAutoscaler").values()
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployments_by_pool(manifests)["serverless"]["metadata"]["name"]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 6)  # an HPA cannot scale to 0
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        (
            {"pools": {"a100": {"replicas": 1}}},
            ["kubernetes.pools", "unknown pool 'a100'", "pools are: control, cpu, h800, h20, serverless, trainer"],
        ),
        (
            {"pools": {"h20": {"replicas": 0}}},
            ["task 'arithmetic'", "its generation", "pool 'h20'", "kubernetes.pools.h20.replicas is 0"],
        ),
        (
            {"pools": {"serverless": {"replicas": 0}}},
            [
                "task 'arithmetic'",
                "its reward 'exact_match'",
                "pool 'serverless'",
                "task 'frozenlake'",
                "its reward 'success'",
            ],
        ),
        ({"pools": {"cpu": {"replicas": 0}}}, ["task 'frozenlake'", "its env 'frozenlake'", "pool 'cpu'"]),
        ({"pools": {"control": {"replicas": 0}}}, ["control pool runs every workflow"]),
        (
            {"pools": {"trainer": {"replicas": 2}}},
            [
                "kubernetes.pools.trainer.replicas is 2 (trainer nodes)",
                "trainer.parallel.tensor 1 x trainer.parallel.data 1 = 1 rank",
                "use 1",
            ],
        ),
        (
            {"pools": {"h800": {"memory": "lots"}}},
            ["kubernetes.pools.h800.memory", "not a Kubernetes quantity: 'lots'"],
        ),
        ({"namespace": "My_NS"}, ["kubernetes.namespace", "not a usable Kubernetes name"]),
        ({"serverless": {"min_replicas": 5, "max_replicas": 2}}, ["kubernetes.serverless", "exceeds max_replicas"]),
        ({"pools": {"h800": {"gpu": 1}}}, ["kubernetes.pools.h800.gpu", "Extra inputs are not permitted"]),
    ],
)
def test_bad_kubernetes_sections_fail_on_load_naming_file_and_field(
    tmp_path: Path, section: dict, expected: list[str]
) -> None:
    path = write_job(tmp_path, EXAMPLES["multitask"], section)
    with pytest.raises(JobSpecError) as err:
        load_job(path)
    message = str(err.value)
    assert message.startswith(f"{path}: invalid job spec")
    for fragment in expected:
        assert fragment in message, message


def test_a_local_temporal_address_is_refused_for_pods() -> None:
    job = load_job(EXAMPLES["frozenlake"], {"temporal": {"address": "127.0.0.1:7233"}})
    with pytest.raises(K8sRenderError, match=r"127\.0\.0\.1:7233.*temporal\.address.*--temporal-address"):
        render(job)


def test_render_checks_pools_even_for_jobs_built_without_validation() -> None:
    job = load_job(EXAMPLES["multitask"])
    job = job.model_copy(update={"kubernetes": KubernetesConfig.model_validate({"pools": {"h20": {"replicas": 0}}})})
    with pytest.raises(K8sRenderError, match=r"task 'arithmetic'.*pool 'h20'"):
        render(job)


# ---------------------------------------------------------------- docs and env servers


def test_the_docs_kubernetes_example_section_renders() -> None:
    """docs/kubernetes.md's `kubernetes:` example is a valid section: documentation that cannot rot silently."""
    page = (REPO / "docs" / "kubernetes.md").read_text()
    block = next(b for b in page.split("```yaml\n")[1:] if b.startswith("kubernetes:")).split("```", 1)[0]
    section = yaml.safe_load(block)["kubernetes"]
    manifests = render(with_kubernetes(load_job(EXAMPLES["multitask"]), section))
    deployments = deployments_by_pool(manifests)
    assert deployments["h20"]["spec"]["replicas"] == 8 and deployments["h800"]["spec"]["replicas"] == 4
    assert all(m["metadata"]["namespace"] == "rl-team" for m in manifests if m["kind"] != "Namespace")
    validate_all(manifests)


def test_the_docs_multi_node_trainer_section_renders() -> None:
    """docs/kubernetes.md's megatron trainer example: 4 nodes x 8 GPUs for tensor 8 x data 4, a shared run dir."""
    page = (REPO / "docs" / "kubernetes.md").read_text()
    blocks = [b.split("```", 1)[0] for b in page.split("```yaml\n")[1:]]
    section = yaml.safe_load(next(b for b in blocks if "trainer:" in b))["kubernetes"]
    manifests = render(megatron_job(8, 4, section))
    (sts,) = by_kind(manifests, "StatefulSet").values()
    assert sts["spec"]["replicas"] == 4 and container(sts)["resources"]["limits"]["nvidia.com/gpu"] == 8
    runs = next(
        c for c in by_kind(manifests, "PersistentVolumeClaim").values() if c["metadata"]["name"].endswith("-runs")
    )
    assert runs["spec"]["accessModes"] == ["ReadWriteMany"]
    validate_all(manifests)


def test_an_env_server_is_a_deployment_and_a_service_the_workers_reach_it_through() -> None:
    job = with_kubernetes(load_job(REPO / "examples" / "openenv.yaml"), {"namespace": "rl"})
    manifests = render(job)
    validate_all(manifests)
    [service] = [m for m in by_kind(manifests, "Service").values() if m["metadata"]["name"] == "openenv-env-frozenlake"]
    deployment = by_kind(manifests, "Deployment")["openenv-env-frozenlake"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"] == [{"name": "http", "port": 8300, "targetPort": "http", "protocol": "TCP"}]
    c = container(deployment)
    assert c["command"][:2] == ["rollart", "env-server"] and c["image"] == DEFAULT_CPU_IMAGE
    assert c["command"][c["command"].index("--host") + 1] == "0.0.0.0"
    assert c["ports"] == [{"name": "http", "containerPort": 8300, "protocol": "TCP"}]
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    # the pods' job points the openenv task at the Service, and loads as it is
    [configmap] = by_kind(manifests, "ConfigMap").values()
    pods_job = JobSpec.model_validate(yaml.safe_load(configmap["data"]["job.yaml"]))
    url = "http://openenv-env-frozenlake.rl.svc.cluster.local:8300"
    assert pods_job.tasks[0].env_args == {"server": "frozenlake", "base_url": url}
    assert pods_job.env_servers[0].url == url
    # the cpu workers hold the sessions: a pool Deployment as for any job
    assert "cpu" in deployments_by_pool(manifests)
