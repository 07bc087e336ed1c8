"""Send rendered manifests to a cluster: server-side dry-run of every object first, then server-side apply.

Nothing is changed unless every object passes the API server's own dry-run (admission, schema,
quotas), so a bad manifest never leaves a half-applied deployment. Objects are applied with
server-side apply (create-or-patch in one call) under the field manager `rollart`; fields other
managers own, such as the serverless replica count KEDA sets, are left alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from rollart.infra.deploy.names import Manifest

__all__ = ["FIELD_MANAGER", "ApplyError", "ApplyReport", "Cluster", "apply_manifests", "connect"]

FIELD_MANAGER = "rollart"


class ApplyError(RuntimeError):
    """The manifests cannot be applied (no cluster, a missing CRD, a rejected object); says what to do."""


class Cluster(Protocol):
    """The part of `kubernetes.dynamic.DynamicClient` this module uses (a fake stands in for it in tests)."""

    resources: Any

    def server_side_apply(
        self,
        resource: Any,
        body: Any = None,
        name: str | None = None,
        namespace: str | None = None,
        force_conflicts: bool | None = None,
        **kwargs: Any,
    ) -> Any: ...


@dataclass(frozen=True)
class ApplyReport:
    """What happened to each object: `dry-run ok`, `applied`, or `skipped` (with why)."""

    lines: list[str]
    applied: bool


def connect(context: str | None = None) -> Cluster:
    """A dynamic client for the current kubeconfig context (or `context`), or in-cluster credentials."""
    import os

    try:
        import urllib3
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException
        from kubernetes.dynamic import DynamicClient
    except ImportError as e:
        raise ApplyError(
            f"`rollart k8s apply` needs the Kubernetes client ({e}): pip install 'rollart[k8s]' "
            "(or use `rollart k8s render` and apply the files with your own tooling)"
        ) from e

    try:
        if "KUBERNETES_SERVICE_HOST" in os.environ and context is None:
            config.load_incluster_config()
            api = client.ApiClient()
        else:
            # KUBECONFIG read now, not at import (the client reads it once when first imported)
            api = config.new_client_from_config(config_file=os.environ.get("KUBECONFIG"), context=context)
    except (ConfigException, OSError) as e:
        raise ApplyError(
            f"no Kubernetes cluster configured: {str(e).rstrip('.')}. Point KUBECONFIG (or ~/.kube/config) at the "
            "cluster, "
            "or use `rollart k8s render` and apply the files with your own tooling"
        ) from e
    api.configuration.retries = 1
    try:
        return DynamicClient(api)
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise ApplyError(f"cannot reach the Kubernetes API at {api.configuration.host}: {e}") from e
    except client.ApiException as e:
        raise ApplyError(
            f"the Kubernetes API at {api.configuration.host} refused discovery: {e.status} {e.reason}"
        ) from e


def apply_manifests(cluster: Cluster, manifests: list[Manifest], dry_run_only: bool = False) -> ApplyReport:
    """Dry-run every object on the server; if all pass (and not `dry_run_only`), apply them in order.

    The Namespace goes first and, unless this is a dry run, is created before the rest are
    dry-run: namespaced objects cannot be dry-run into a namespace that does not exist.
    """
    from kubernetes.dynamic.exceptions import DynamicApiError, NotFoundError

    resources = [_resource(cluster, m) for m in manifests]
    lines: list[str] = []
    pending = list(zip(manifests, resources))
    namespaces = [(m, r) for m, r in pending if m["kind"] == "Namespace"]
    pending = [(m, r) for m, r in pending if m["kind"] != "Namespace"]

    for m, r in namespaces:
        try:
            _send(cluster, m, r, dry_run=True)
            if not dry_run_only:
                _send(cluster, m, r, dry_run=False)
        except DynamicApiError as e:
            raise ApplyError(f"{_ref(m)}: {e.summary()} (nothing else was sent)") from e
        lines.append(f"{_ref(m)}: {'dry-run ok' if dry_run_only else 'applied'}")

    missing_ns: set[str] = set()
    if dry_run_only:
        ns_resource = _resource(cluster, {"apiVersion": "v1", "kind": "Namespace"})
        for ns in {m["metadata"]["namespace"] for m, _ in pending if m["metadata"].get("namespace")}:
            try:
                ns_resource.get(name=ns)
            except NotFoundError:
                missing_ns.add(ns)

    failures = []
    for m, r in pending:
        ns = m["metadata"].get("namespace")
        if ns in missing_ns:
            lines.append(f"{_ref(m)}: skipped (namespace {ns!r} does not exist yet; it is created on apply)")
            continue
        try:
            _send(cluster, m, r, dry_run=True)
            lines.append(f"{_ref(m)}: dry-run ok")
        except DynamicApiError as e:
            failures.append(f"{_ref(m)}: {e.summary()}")
    if failures:
        raise ApplyError("the server rejected (dry-run; nothing was changed):\n  " + "\n  ".join(failures))
    if dry_run_only:
        return ApplyReport(lines=lines, applied=False)

    lines = [line for line in lines if line.endswith("applied")]
    for m, r in pending:
        try:
            _send(cluster, m, r, dry_run=False)
        except DynamicApiError as e:
            done = ", ".join(line.split(":")[0] for line in lines) or "nothing"
            raise ApplyError(f"{_ref(m)}: {e.summary()} (already applied: {done})") from e
        lines.append(f"{_ref(m)}: applied")
    return ApplyReport(lines=lines, applied=True)


def _resource(cluster: Cluster, m: Manifest) -> Any:
    from kubernetes.dynamic.exceptions import ResourceNotFoundError

    try:
        return cluster.resources.get(api_version=m["apiVersion"], kind=m["kind"])
    except ResourceNotFoundError as e:
        if m["apiVersion"].startswith("keda.sh/"):
            raise ApplyError(
                f"this cluster has no {m['apiVersion']} {m['kind']}: KEDA is not installed. Install KEDA (2.17 or "
                "newer, for its temporal scaler), or set kubernetes.serverless.keda: false (or pass --hpa) to "
                "scale the serverless pool with a CPU HorizontalPodAutoscaler instead"
            ) from e
        raise ApplyError(f"this cluster does not serve {m['apiVersion']} {m['kind']}") from e


def _send(cluster: Cluster, m: Manifest, resource: Any, dry_run: bool) -> Any:
    extra = {"dry_run": "All"} if dry_run else {}
    return cluster.server_side_apply(
        resource,
        body=m,
        name=m["metadata"]["name"],
        namespace=m["metadata"].get("namespace"),
        force_conflicts=True,
        field_manager=FIELD_MANAGER,
        **extra,
    )


def _ref(m: Manifest) -> str:
    return f"{m['kind']}/{m['metadata']['name']}"
