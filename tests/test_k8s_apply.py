"""Kubernetes manifests sent to a cluster: the CLI's render and apply, and apply's order.

There is no cluster here: `apply_manifests` runs against a fake dynamic client that records calls (its logic
only — a real API server's dry-run is not exercised), while `connect` and the CLI are run for real against a
missing kubeconfig and an unreachable API server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes.client import ApiException
from kubernetes.dynamic.exceptions import NotFoundError, ResourceNotFoundError, api_exception

from rollart.infra.deploy.apply import ApplyError, apply_manifests, connect
from rollart.infra.deploy.names import Manifest
from rollart.infra.deploy.render import render
from rollart.infra.local.devserver import free_port
from rollart.spec.config import load_job
from tests.support.cli import rollart
from tests.support.k8s import EXAMPLES, K8S_VERSION, container, write_job

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
    assert [m["kind"] for m in manifests][-2:] == ["HorizontalPodAutoscaler", "CronJob"]  # then the claims' sweep
    (gc,) = manifests[-1]["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert gc["image"] == "registry.example/rollart:2-cpu" and gc["command"][-1] == "t.example:7233"
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


def test_connect_without_the_kubernetes_client_says_which_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """`kubernetes` is the `k8s` extra: without it, apply says what to install instead of a ModuleNotFoundError."""
    import sys

    monkeypatch.setitem(sys.modules, "kubernetes", None)  # as if not installed: importing it raises ImportError
    with pytest.raises(ApplyError, match=r"pip install 'rollart\[k8s\]'"):
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
