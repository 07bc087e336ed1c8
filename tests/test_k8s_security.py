"""Kubernetes manifests of a secured job: Temporal TLS files and API key from a Secret, KEDA's credentials, and the
NetworkPolicies that keep Mooncake's listeners inside the job.

Core objects are checked with kubernetes-validate (Kubernetes 1.30, offline), KEDA's CRDs structurally, as in
tests/test_k8s_render.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from rollart.cli.main import build_parser
from rollart.infra.deploy.names import K8sRenderError, Manifest
from rollart.infra.deploy.render import render
from rollart.infra.deploy.security import env_token_command, secret_command
from rollart.spec.config import JobSpec, JobSpecError, load_job
from rollart.spec.pools import DEFAULT_POOLS
from tests.support.paths import REPO

K8S_VERSION = "1.30.0"
EXAMPLES = REPO / "examples"
TEMPORAL = {
    "address": "temporal.prod.example:7233",
    "api_key_env": "TEMPORAL_API_KEY",
    "tls": {
        "ca": "certs/ca.pem",
        "cert": "certs/client.pem",
        "key": "certs/client.key",
        "server_name": "temporal.prod.example",
    },
}
MOONCAKE = {"kind": "mooncake", "mooncake": {"master": "mooncake-master.rollart.svc.cluster.local:50051"}}


def secured(example: str = "multitask", temporal: dict[str, Any] | None = None, **sections: Any) -> JobSpec:
    return load_job(EXAMPLES / f"{example}.yaml", {"temporal": temporal or TEMPORAL, **sections})


def workloads(manifests: list[Manifest]) -> dict[str, Manifest]:
    return {m["metadata"]["name"]: m for m in manifests if m["kind"] in ("Deployment", "StatefulSet")}


def pod(workload: Manifest) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def of_kind(manifests: list[Manifest], kind: str) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind]


def validate(manifests: list[Manifest]) -> None:
    for m in manifests:
        if not m["apiVersion"].startswith("keda.sh/"):
            kubernetes_validate.validate(m, K8S_VERSION, strict=True)


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a Kubernetes label selector (matchLabels, matchExpressions with In) picks a pod with `labels`."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        assert e["operator"] == "In"
        if labels.get(e["key"]) not in e["values"]:
            return False
    return True


# ---------------------------------------------------------------- Temporal TLS and API key


def test_every_pool_pod_mounts_the_tls_files_and_the_api_key_from_the_secret_as_files() -> None:
    manifests = render(secured())
    validate(manifests)
    pools = workloads(manifests)
    assert set(pools) == {
        "multitask-control",
        "multitask-cpu",
        "multitask-h800",
        "multitask-h20",
        "multitask-serverless",
        "multitask-trainer",
    }
    for name, w in pools.items():
        spec = pod(w)
        (volume,) = [v for v in spec["volumes"] if v["name"] == "temporal-credentials"]
        assert volume["secret"] == {
            "secretName": "multitask-temporal",
            "defaultMode": 0o440,
            "items": [
                {"key": "ca.crt", "path": "ca.crt"},
                {"key": "tls.crt", "path": "tls.crt"},
                {"key": "tls.key", "path": "tls.key"},
                {"key": "api-key", "path": "api-key"},
            ],
        }, name
        (c,) = spec["containers"]
        mount = {"name": "temporal-credentials", "mountPath": "/etc/rollart-temporal", "readOnly": True}
        assert mount in c["volumeMounts"]
        assert not [e for e in c["env"] if "valueFrom" in e and "secretKeyRef" in e["valueFrom"]]  # no key in env
        assert spec["securityContext"]["fsGroup"] == 10001  # the files are group-readable for the image's user
    # the pods' job names the mounted files; it loads there as it is
    (configmap,) = of_kind(manifests, "ConfigMap")
    pods_job = JobSpec.model_validate(yaml.safe_load(configmap["data"]["job.yaml"]))
    tls = pods_job.temporal.tls
    assert (tls.ca, tls.cert, tls.key) == (
        Path("/etc/rollart-temporal/ca.crt"),
        Path("/etc/rollart-temporal/tls.crt"),
        Path("/etc/rollart-temporal/tls.key"),
    )
    assert tls.server_name == "temporal.prod.example" and pods_job.temporal.api_key_env is None
    assert pods_job.temporal.api_key_file == Path("/etc/rollart-temporal/api-key")
    assert "certs/" not in configmap["data"]["job.yaml"] and "Secret" not in {m["kind"] for m in manifests}


def test_only_the_files_the_job_names_are_mounted_and_env_servers_get_none() -> None:
    manifests = render(
        secured(
            "openenv",
            {"address": "t.example:7233", "tls": {"ca": "ca.pem"}},
            kubernetes={"serverless": {"keda": False}},
        )
    )
    validate(manifests)
    for name, w in workloads(manifests).items():
        volumes = {v["name"]: v for v in pod(w).get("volumes", [])}
        if "-env-" in name:  # an env server never talks to Temporal
            assert "temporal-credentials" not in volumes
            continue
        assert volumes["temporal-credentials"]["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
        assert all("valueFrom" not in e for e in pod(w)["containers"][0]["env"] if e["name"] != "POD_INDEX")


@pytest.mark.parametrize(
    "key", [{"api_key_env": "TEMPORAL_API_KEY"}, {"api_key_file": "/run/keys/temporal"}], ids=["env", "file"]
)
def test_an_api_key_alone_is_one_file_from_the_secret(key: dict[str, str]) -> None:
    manifests = render(secured("frozenlake", {"address": "ns.acct.tmprl.cloud:7233", **key}))
    validate(manifests)
    for w in workloads(manifests).values():
        (volume,) = [v for v in pod(w)["volumes"] if v["name"] == "temporal-credentials"]
        assert volume["secret"]["items"] == [{"key": "api-key", "path": "api-key"}]
        assert not any(e["name"] == "TEMPORAL_API_KEY" for e in pod(w)["containers"][0]["env"])
    (auth,) = of_kind(manifests, "TriggerAuthentication")
    assert auth["spec"]["secretTargetRef"] == [{"parameter": "apiKey", "name": "frozenlake-temporal", "key": "api-key"}]


def test_the_secret_name_is_set_in_the_kubernetes_section_and_the_command_creates_it() -> None:
    job = secured(kubernetes={"namespace": "rl-team", "temporal_secret": "temporal-prod-creds"})
    manifests = render(job)
    names = {
        v["secret"]["secretName"] for w in workloads(manifests).values() for v in pod(w)["volumes"] if "secret" in v
    }
    keys = {
        e["valueFrom"]["secretKeyRef"]["name"]
        for w in workloads(manifests).values()
        for e in pod(w)["containers"][0]["env"]
        if "valueFrom" in e and "secretKeyRef" in e["valueFrom"]
    }
    (auth,) = of_kind(manifests, "TriggerAuthentication")
    assert names == {r["name"] for r in auth["spec"]["secretTargetRef"]} == {"temporal-prod-creds"} and not keys
    assert secret_command(job) == (
        "kubectl -n rl-team create secret generic temporal-prod-creds \\\n"
        "    --from-file=ca.crt=certs/ca.pem \\\n"
        "    --from-file=tls.crt=certs/client.pem \\\n"
        "    --from-file=tls.key=certs/client.key \\\n"
        '    --from-literal=api-key="$TEMPORAL_API_KEY"'
    )
    assert secret_command(load_job(EXAMPLES / "multitask.yaml")) is None


def test_keda_gets_the_credentials_through_a_trigger_authentication() -> None:
    manifests = render(secured())
    (auth,) = of_kind(manifests, "TriggerAuthentication")
    (scaler,) = of_kind(manifests, "ScaledObject")
    assert [m["kind"] for m in manifests].index("TriggerAuthentication") < [m["kind"] for m in manifests].index(
        "ScaledObject"
    )
    assert auth["apiVersion"] == "keda.sh/v1alpha1" and auth["metadata"]["namespace"] == "rollart"
    assert auth["spec"]["secretTargetRef"] == [
        {"parameter": "ca", "name": "multitask-temporal", "key": "ca.crt"},
        {"parameter": "cert", "name": "multitask-temporal", "key": "tls.crt"},
        {"parameter": "key", "name": "multitask-temporal", "key": "tls.key"},
        {"parameter": "apiKey", "name": "multitask-temporal", "key": "api-key"},
    ]
    (trigger,) = scaler["spec"]["triggers"]
    assert trigger["authenticationRef"] == {"name": auth["metadata"]["name"]}
    assert trigger["metadata"]["tlsServerName"] == "temporal.prod.example"
    assert trigger["metadata"]["endpoint"] == "temporal.prod.example:7233"
    plain = render(load_job(EXAMPLES / "multitask.yaml"))  # no credentials: no TriggerAuthentication, no reference
    assert not of_kind(plain, "TriggerAuthentication")
    assert "authenticationRef" not in of_kind(plain, "ScaledObject")[0]["spec"]["triggers"][0]


@pytest.mark.parametrize(
    ("temporal", "expected"),
    [
        ({"tls": {"ca": "ca.pem"}}, "KEDA's temporal scaler uses TLS only with a client certificate or an API key"),
        (
            {"tls": {"ca": "ca.pem"}, "api_key_env": "K"},
            "cannot use temporal.tls.ca: give the job a client certificate",
        ),
    ],
)
def test_credentials_keda_cannot_use_are_refused_unless_the_hpa_scales(temporal: dict, expected: str) -> None:
    job = secured(temporal={"address": "t.example:7233", **temporal})
    with pytest.raises(K8sRenderError, match=expected) as e:
        render(job)
    assert "--hpa" in str(e.value)
    hpa = render(
        secured(temporal={"address": "t.example:7233", **temporal}, kubernetes={"serverless": {"keda": False}})
    )
    assert of_kind(hpa, "HorizontalPodAutoscaler") and not of_kind(hpa, "TriggerAuthentication")
    validate(hpa)


def test_render_prints_how_to_create_the_secret(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = yaml.safe_load((EXAMPLES / "frozenlake.yaml").read_text())
    raw["temporal"] = {
        "address": "t.example:7233",
        "tls": {"ca": "certs/ca.pem", "cert": "certs/c.pem", "key": "certs/c.key"},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(raw))
    args = build_parser().parse_args(["k8s", "render", str(path), "-o", str(tmp_path / "out")])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "from Secret 'frozenlake-temporal', which is not rendered" in out
    assert f"once its namespace exists (kubectl apply -f {tmp_path}/out/00-namespace-rollart.yaml)" in out
    assert (
        "  kubectl -n rollart create secret generic frozenlake-temporal \\\n    --from-file=ca.crt=certs/ca.pem \\\n"
        "    --from-file=tls.crt=certs/c.pem \\\n    --from-file=tls.key=certs/c.key\n"
    ) in out
    raw.pop("temporal")
    path.write_text(yaml.safe_dump(raw))
    assert args.func(args) == 0 and "Secret" not in capsys.readouterr().out


# ---------------------------------------------------------------- Mooncake's listeners stay inside the job


def test_a_mooncake_store_gets_network_policies_letting_only_the_pools_in() -> None:
    job = secured("openenv", {"address": "t.example:7233"}, store=MOONCAKE)
    manifests = render(job)
    validate(manifests)
    policies = {m["metadata"]["name"]: m["spec"] for m in of_kind(manifests, "NetworkPolicy")}
    assert set(policies) >= {"openenv-mooncake-ingress", "openenv-pools-ingress"}  # the others: test_k8s_network
    policies = {name: spec for name, spec in policies.items() if name.endswith(("-mooncake-ingress", "-pools-ingress"))}
    kinds = [m["kind"] for m in manifests]
    assert kinds.index("NetworkPolicy") < kinds.index("Deployment")  # in place before any pod starts
    mooncake_pod = {"app.kubernetes.io/name": "mooncake", "app.kubernetes.io/component": "master"}
    pool_pods = {name: w["spec"]["template"]["metadata"]["labels"] for name, w in workloads(manifests).items()}
    env_server = pool_pods.pop("openenv-env-frozenlake")
    assert {p.removeprefix("openenv-") for p in pool_pods} == {"control", "cpu", "h800", "serverless", "trainer"}
    for name, spec in policies.items():
        assert spec["policyTypes"] == ["Ingress"]
        (rule,) = spec["ingress"]
        assert "ports" not in rule  # every port: the transfer engines' are picked at random
        allowed = [peer["podSelector"] for peer in rule["from"]]
        assert all(set(peer) == {"podSelector"} for peer in rule["from"])  # pods of this namespace only
        for labels in [*pool_pods.values(), mooncake_pod]:  # the pools' pods and the Mooncake pods may connect...
            assert any(selects(s, labels) for s in allowed), (name, labels)
        for labels in (env_server, {"app": "something-else"}, {**mooncake_pod, "app.kubernetes.io/name": "other"}):
            assert not any(selects(s, labels) for s in allowed), (name, labels)  # ...nobody else
    assert selects(policies["openenv-mooncake-ingress"]["podSelector"], mooncake_pod)
    assert all(selects(policies["openenv-pools-ingress"]["podSelector"], labels) for labels in pool_pods.values())
    assert not selects(policies["openenv-pools-ingress"]["podSelector"], env_server)
    assert {
        v for e in policies["openenv-pools-ingress"]["podSelector"]["matchExpressions"] for v in e["values"]
    } == set(DEFAULT_POOLS)


def test_the_mooncake_pod_labels_are_configurable_and_the_policies_can_be_left_out() -> None:
    section = {"mooncake": {"pod_labels": {"app": "mooncake", "tier": "store"}}}
    manifests = render(secured("frozenlake", {"address": "t.example:7233"}, store=MOONCAKE, kubernetes=section))
    policy = next(m for m in of_kind(manifests, "NetworkPolicy") if m["metadata"]["name"].endswith("-mooncake-ingress"))
    assert policy["spec"]["podSelector"] == {"matchLabels": {"app": "mooncake", "tier": "store"}}

    def mooncake_policies(manifests: list[Manifest]) -> list[str]:
        names = [m["metadata"]["name"] for m in of_kind(manifests, "NetworkPolicy")]
        return [n for n in names if n.endswith(("-mooncake-ingress", "-pools-ingress"))]

    off = {"mooncake": {"network_policy": False}}
    assert not mooncake_policies(
        render(secured("frozenlake", {"address": "t.example:7233"}, store=MOONCAKE, kubernetes=off))
    )
    assert not mooncake_policies(render(load_job(EXAMPLES / "frozenlake.yaml")))  # a local store: no Mooncake
    with pytest.raises(JobSpecError, match=r"kubernetes.mooncake.pod_labels"):  # {} would select every pod
        secured("frozenlake", {"address": "t.example:7233"}, kubernetes={"mooncake": {"pod_labels": {}}})


def test_the_docs_secured_connections_example_loads_and_renders_its_secret_command() -> None:
    """docs/clusters.md's `temporal:` example is a valid section, and its kubectl line is the one the render prints."""
    page = (REPO / "docs" / "clusters.md").read_text()
    section = page.split("\n## Secured connections\n", 1)[1].split("\n## ", 1)[0]
    block = next(b for b in section.split("```yaml\n")[1:] if b.startswith("temporal:")).split("```", 1)[0]
    job = load_job(EXAMPLES / "multitask.yaml", yaml.safe_load(block))
    assert job.temporal.tls.server_name == "temporal.prod.example" and job.temporal.api_key_env == "TEMPORAL_API_KEY"
    validate(render(job))
    kubectl = next(b for b in section.split("```bash\n")[1:] if b.startswith("kubectl")).split("```", 1)[0]
    assert kubectl.strip() == secret_command(job)


def test_an_api_key_file_goes_into_the_secret_from_the_file() -> None:
    job = secured("frozenlake", {"address": "ns.acct.tmprl.cloud:7233", "api_key_file": "keys/temporal key"})
    assert secret_command(job) == (
        "kubectl -n rollart create secret generic frozenlake-temporal \\\n    --from-file=api-key='keys/temporal key'"
    )
    (auth,) = of_kind(render(job), "TriggerAuthentication")  # KEDA takes it from the same Secret key
    assert auth["spec"]["secretTargetRef"] == [{"parameter": "apiKey", "name": "frozenlake-temporal", "key": "api-key"}]


# ---------------------------------------------------------------- the env servers' token


def _token_pods(manifests: list[Manifest]) -> set[str]:
    """The workloads (and the CronJob) whose pod mounts the env-token Secret; each one that does is checked whole:
    the file, the variable naming it, and the token in no variable."""
    pods = {name: pod(w) for name, w in workloads(manifests).items()}
    pods |= {
        m["metadata"]["name"]: m["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        for m in of_kind(manifests, "CronJob")
    }
    mounting = set()
    for name, spec in pods.items():
        (container,) = spec["containers"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        env = {e["name"]: e for e in container.get("env", [])}
        assert all("secretKeyRef" not in e.get("valueFrom", {}) for e in env.values()), name  # never a variable
        if "env-token" not in volumes:
            assert "ROLLART_ENV_SERVER_TOKEN_FILE" not in env, name
            continue
        mounting.add(name)
        assert volumes["env-token"]["secret"] == {
            "secretName": "openenv-env-token",
            "items": [{"key": "token", "path": "token"}],
            "defaultMode": 0o440,
        }
        assert "optional" not in volumes["env-token"]["secret"]  # no Secret, no pod: never a server without it
        mount = next(m for m in container["volumeMounts"] if m["name"] == "env-token")
        assert mount == {"name": "env-token", "mountPath": "/etc/rollart-env-token", "readOnly": True}
        assert env["ROLLART_ENV_SERVER_TOKEN_FILE"] == {
            "name": "ROLLART_ENV_SERVER_TOKEN_FILE",
            "value": "/etc/rollart-env-token/token",
        }
    return mounting


def test_the_env_token_is_mounted_in_the_env_servers_and_the_pools_that_call_them_only() -> None:
    manifests = render(load_job(EXAMPLES / "openenv.yaml"))
    validate(manifests)
    assert _token_pods(manifests) == {"openenv-env-frozenlake", "openenv-cpu"}  # not control, trainer, h800, gc...
    assert not of_kind(manifests, "Secret")  # its contents are not the job's

    spec = load_job(EXAMPLES / "openenv.yaml")
    moved = render(
        load_job(EXAMPLES / "openenv.yaml", {"tasks": [{**spec.tasks[0].model_dump(mode="json"), "env_pool": "h800"}]})
    )
    assert _token_pods(moved) == {"openenv-env-frozenlake", "openenv-h800"}  # the pool the sessions moved to
    spare = [{"name": "frozenlake", "env": "frozenlake", "port": 8300}, {"name": "spare", "port": 8400}]
    assert _token_pods(render(load_job(EXAMPLES / "openenv.yaml", {"env_servers": spare}))) == {
        "openenv-env-frozenlake",
        "openenv-env-spare",  # called by nobody, but it still refuses everyone without the token
        "openenv-cpu",
    }
    none = render(load_job(EXAMPLES / "frozenlake.yaml"))  # no env servers: no token anywhere
    assert not [v for w in workloads(none).values() for v in pod(w)["volumes"] if v["name"] == "env-token"]
    assert env_token_command(load_job(EXAMPLES / "frozenlake.yaml")) is None


def test_render_prints_how_to_create_the_env_token_secret(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["k8s", "render", str(EXAMPLES / "openenv.yaml"), "-o", str(tmp_path / "out")])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "the token of Secret 'openenv-env-token', which is not rendered" in out
    assert (
        "  kubectl -n rollart create secret generic openenv-env-token \\\n"
        '    --from-literal=token="$(openssl rand -hex 32)"\n'
    ) in out
    assert "frozenlake-temporal" not in out  # the example uses no Temporal credentials: no line for them
