"""Shared helpers of the Kubernetes manifest tests (tests/test_k8s_*.py): picking objects out of a render,
the examples they render, and strict validation against the Kubernetes version they pin."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from rollart.infra.deploy.names import Manifest
from rollart.spec.config import JobSpec, load_job
from tests.support.paths import REPO

K8S_VERSION = "1.30.0"
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
