"""Every pod `rollart k8s render` emits passes the Pod Security Standards' "restricted" profile, writes only where it
is given a volume, and runs the envs' code in `kubernetes.env_runtime_class` when one is set.

`restricted_violations` implements the profile's checks (baseline's and restricted's, as listed on
https://kubernetes.io/docs/concepts/security/pod-security-standards/ for policy version v1.30) over a pod template,
naming the field that fails; it runs over every pod template of every example and of synthetic jobs covering GPU
pools, env servers, Mooncake, a multi-node trainer, a secured Temporal and the store's CronJob.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollart.infra.deploy.names import Manifest
from rollart.infra.deploy.pod_security import IMAGE_HOME, IMAGE_UID
from rollart.infra.deploy.render import render
from rollart.infra.temporal.tls import TemporalSecurityError, api_key_from_file
from rollart.spec.config import JobSpec, JobSpecError, TemporalConfig, load_job
from tests.support.k8s import megatron_job, validate_all
from tests.support.paths import REPO

MOONCAKE = {"kind": "mooncake", "mooncake": {"master": "mooncake-master.rollart.svc.cluster.local:50051"}}
SECURED = {
    "address": "temporal.prod.example:7233",
    "api_key_env": "TEMPORAL_API_KEY",
    "tls": {"ca": "ca.pem", "cert": "c.pem", "key": "c.key"},
}

# ---------------------------------------------------------------- the profile

_VOLUME_TYPES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected"}
_VOLUME_TYPES |= {"secret"}
_SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
_SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
_APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"


def restricted_violations(template: dict[str, Any]) -> list[str]:
    """What keeps a pod template (metadata, spec) from the "restricted" profile, one line per field."""
    spec, meta = template["spec"], template.get("metadata", {})
    pod_sc = spec.get("securityContext", {})
    out: list[str] = []
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            out.append(f"spec.{field} must be unset or false")
    for i, v in enumerate(spec.get("volumes", [])):
        kinds = set(v) - {"name"}
        if not kinds <= _VOLUME_TYPES:
            out.append(f"spec.volumes[{i}] ({v['name']}): type {sorted(kinds - _VOLUME_TYPES)} is not allowed")
    for i, s in enumerate(pod_sc.get("sysctls", [])):
        if s["name"] not in _SAFE_SYSCTLS:
            out.append(f"spec.securityContext.sysctls[{i}].name: {s['name']} is not a safe sysctl")
    for key, value in meta.get("annotations", {}).items():
        if key.startswith(_APPARMOR_ANNOTATION) and not (value == "runtime/default" or value.startswith("localhost/")):
            out.append(f"metadata.annotations[{key}]: AppArmor {value!r} is not allowed")
    out += _context_violations("spec.securityContext", pod_sc)
    containers = [
        (f"spec.{kind}[{i}]", c)
        for kind in ("initContainers", "containers", "ephemeralContainers")
        for i, c in enumerate(spec.get(kind, []))
    ]
    assert containers, "a pod without containers"
    for where, c in containers:
        sc = c.get("securityContext", {})
        at = f"{where}.securityContext"
        out += _context_violations(at, sc)
        if sc.get("privileged"):
            out.append(f"{at}.privileged must be unset or false")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{at}.allowPrivilegeEscalation must be false")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{at}.procMount must be unset or Default")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            out.append(f"{at}.capabilities.drop must include ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"{at}.capabilities.add may hold only NET_BIND_SERVICE")
        if not (sc.get("runAsNonRoot") is True or (pod_sc.get("runAsNonRoot") is True and "runAsNonRoot" not in sc)):
            out.append(f"{at}.runAsNonRoot must be true (here or in spec.securityContext)")
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{at}.seccompProfile.type must be RuntimeDefault or Localhost (here or for the pod)")
        for i, p in enumerate(c.get("ports", [])):
            if p.get("hostPort"):
                out.append(f"{where}.ports[{i}].hostPort must be unset or 0")
    return out


def _context_violations(at: str, sc: dict[str, Any]) -> list[str]:
    """The checks a pod's and a container's securityContext share."""
    out = []
    if sc.get("runAsUser") == 0:
        out.append(f"{at}.runAsUser must not be 0")
    if sc.get("windowsOptions", {}).get("hostProcess"):
        out.append(f"{at}.windowsOptions.hostProcess must be unset or false")
    if sc.get("seccompProfile", {}).get("type") == "Unconfined":
        out.append(f"{at}.seccompProfile.type must not be Unconfined")
    if sc.get("appArmorProfile", {}).get("type", "RuntimeDefault") not in ("RuntimeDefault", "Localhost"):
        out.append(f"{at}.appArmorProfile.type must be RuntimeDefault or Localhost")
    selinux = sc.get("seLinuxOptions", {})
    if selinux.get("type", "") not in _SELINUX_TYPES:
        out.append(f"{at}.seLinuxOptions.type {selinux['type']!r} is not allowed")
    for field in ("user", "role"):
        if selinux.get(field):
            out.append(f"{at}.seLinuxOptions.{field} must be unset")
    return out


def pod_templates(manifests: list[Manifest]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every pod template of a render: Deployments, StatefulSets, DaemonSets, Jobs and CronJobs."""
    for m in manifests:
        name = f"{m['kind']}/{m['metadata']['name']}"
        if m["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            yield name, m["spec"]["template"]
        elif m["kind"] == "CronJob":
            yield name, m["spec"]["jobTemplate"]["spec"]["template"]
        else:
            assert "template" not in m.get("spec", {}), f"{name}: a pod template this test does not know"


def _jobs() -> dict[str, JobSpec]:
    jobs = {p.stem: load_job(p) for p in sorted((REPO / "examples").glob("*.yaml"))}
    openenv = REPO / "examples" / "openenv.yaml"
    jobs["openenv-mooncake-secured-gvisor"] = load_job(
        openenv, {"store": MOONCAKE, "temporal": SECURED, "kubernetes": {"env_runtime_class": "gvisor"}}
    )
    jobs["megatron-2-nodes-secured"] = megatron_job(2, 2, {"pools": {"trainer": {"replicas": 2}}})
    jobs["multitask-hpa-gpus"] = load_job(
        REPO / "examples" / "multitask.yaml",
        {"temporal": SECURED, "kubernetes": {"serverless": {"keda": False}, "pools": {"h20": {"replicas": 2}}}},
    )
    return jobs


JOBS = _jobs()


# ---------------------------------------------------------------- every rendered pod


@pytest.mark.parametrize("job", sorted(JOBS))
def test_every_pod_passes_the_restricted_profile(job: str) -> None:
    manifests = render(JOBS[job])
    templates = dict(pod_templates(manifests))
    assert templates
    problems = [f"{name}: {p}" for name, t in templates.items() for p in restricted_violations(t)]
    assert not problems, "\n".join(problems)


def test_the_synthetic_jobs_cover_gpus_env_servers_mooncake_the_trainers_nodes_and_the_cronjob() -> None:
    seen: dict[str, set[str]] = {}
    for job in JOBS.values():
        manifests = render(job)
        validate_all(manifests)
        for name, t in pod_templates(manifests):
            (c,) = t["spec"]["containers"]
            gpus = "nvidia.com/gpu" in c["resources"]["limits"]
            kind = "cronjob" if name.startswith("CronJob/") else "env-server" if "-env-" in name else "pool"
            seen.setdefault(kind, set()).add("gpu" if gpus else "cpu")
            if name.startswith("StatefulSet/") and "--nnodes" in c["command"]:
                seen.setdefault("trainer-nodes", set()).add("gpu" if gpus else "cpu")
    assert seen == {"pool": {"gpu", "cpu"}, "env-server": {"cpu"}, "cronjob": {"cpu"}, "trainer-nodes": {"gpu"}}


def test_pods_run_as_the_images_user_on_a_read_only_root_and_write_to_their_own_volumes() -> None:
    manifests = render(JOBS["openenv-mooncake-secured-gvisor"]) + render(JOBS["frozenlake_megatron"])
    for name, t in pod_templates(manifests):
        spec = t["spec"]
        assert spec["securityContext"] == {
            "runAsNonRoot": True,
            "runAsUser": IMAGE_UID,
            "runAsGroup": IMAGE_UID,
            "fsGroup": IMAGE_UID,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        }, name
        (c,) = spec["containers"]
        assert c["securityContext"]["readOnlyRootFilesystem"] is True, name
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        for path in ("/tmp", IMAGE_HOME, "/opt/rollart/.rollart"):  # tempfiles; caches; the tiny models
            assert volumes[mounts[path]["name"]] == {"name": mounts[path]["name"], "emptyDir": {}}, (name, path)
        writable = {p for p, m in mounts.items() if not m.get("readOnly")}
        assert writable - {"/tmp", IMAGE_HOME, "/opt/rollart/.rollart"} <= {
            "/var/lib/rollart/store",
            "/var/lib/rollart/runs",
            "/dev/shm",
        }, name
        if name.startswith(("StatefulSet/", "CronJob/")) and "frozenlake" in name:
            assert "/var/lib/rollart/store" in writable  # a local store: on the shared volume
        if name == "StatefulSet/frozenlake-trainer":
            assert "/var/lib/rollart/runs" in writable


def test_the_root_filesystem_can_be_left_writable() -> None:
    manifests = render(
        load_job(REPO / "examples" / "frozenlake.yaml", {"kubernetes": {"read_only_root_filesystem": False}})
    )
    for name, t in pod_templates(manifests):
        sc = t["spec"]["containers"][0]["securityContext"]
        assert sc["readOnlyRootFilesystem"] is False and not restricted_violations(t), name


@pytest.mark.parametrize(
    ("break_it", "field"),
    [
        (lambda s, c: s.update(hostNetwork=True), "spec.hostNetwork"),
        (lambda s, c: s.update(hostPID=True), "spec.hostPID"),
        (lambda s, c: s.update(hostIPC=True), "spec.hostIPC"),
        (
            lambda s, c: s["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
            "spec.volumes[4] (h)",
        ),  # after the scratch dirs and the token
        (lambda s, c: c["securityContext"].update(privileged=True), "securityContext.privileged"),
        (lambda s, c: c["securityContext"].update(allowPrivilegeEscalation=True), "allowPrivilegeEscalation"),
        (lambda s, c: c["securityContext"]["capabilities"].update(drop=[]), "capabilities.drop"),
        (lambda s, c: c["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]), "capabilities.add"),
        (lambda s, c: c["securityContext"].update(runAsNonRoot=False), "containers[0].securityContext.runAsNonRoot"),
        (lambda s, c: s["securityContext"].update(runAsUser=0), "spec.securityContext.runAsUser"),
        (lambda s, c: c["securityContext"].update(seccompProfile={"type": "Unconfined"}), "seccompProfile.type"),
        (lambda s, c: c["ports"].__setitem__(0, {**c["ports"][0], "hostPort": 80}), "ports[0].hostPort"),
        (lambda s, c: s["securityContext"].update(sysctls=[{"name": "kernel.msgmax", "value": "1"}]), "sysctls[0]"),
        (lambda s, c: c["securityContext"].update(procMount="Unmasked"), "procMount"),
        (lambda s, c: c["securityContext"].update(appArmorProfile={"type": "Unconfined"}), "appArmorProfile"),
        (lambda s, c: s["securityContext"].update(seLinuxOptions={"type": "spc_t"}), "seLinuxOptions.type"),
        (lambda s, c: c["securityContext"].update(windowsOptions={"hostProcess": True}), "hostProcess"),
    ],
)
def test_the_profile_check_names_what_breaks_it(break_it: Any, field: str) -> None:
    """Guards the test above against a check that passes anything: each violation is caught and named."""
    manifests = render(load_job(REPO / "examples" / "openenv.yaml"))
    template = copy.deepcopy(dict(pod_templates(manifests))["Deployment/openenv-env-frozenlake"])
    assert not restricted_violations(template)
    spec = template["spec"]
    break_it(spec, spec["containers"][0])
    problems = restricted_violations(template)
    assert any(field in p for p in problems), problems


# ---------------------------------------------------------------- gVisor for the envs


def test_env_runtime_class_puts_the_env_pools_and_env_servers_in_it_and_nothing_else() -> None:
    manifests = render(JOBS["openenv-mooncake-secured-gvisor"])
    validate_all(manifests)
    classes = {name: t["spec"].get("runtimeClassName") for name, t in pod_templates(manifests)}
    assert classes == {
        "Deployment/openenv-control": None,
        "Deployment/openenv-cpu": "gvisor",  # role env: the envs' sessions, tool calls, agent programs
        "Deployment/openenv-h800": None,
        "Deployment/openenv-serverless": None,
        "StatefulSet/openenv-trainer": None,
        "Deployment/openenv-env-frozenlake": "gvisor",
    }
    plain = render(load_job(REPO / "examples" / "openenv.yaml"))  # null by default: the cluster's runtime
    assert not [name for name, t in pod_templates(plain) if "runtimeClassName" in t["spec"]]


@pytest.mark.parametrize("value", ["gVisor", "-gvisor", "run sc", ""])
def test_env_runtime_class_must_be_a_kubernetes_name(value: str) -> None:
    with pytest.raises(JobSpecError, match=r"kubernetes.env_runtime_class"):
        load_job(REPO / "examples" / "openenv.yaml", {"kubernetes": {"env_runtime_class": value}})


# ---------------------------------------------------------------- the API key as a file


def test_the_api_key_is_read_from_its_file(tmp_path: Path) -> None:
    key = tmp_path / "api-key"
    key.write_text("sk-123\n")
    assert api_key_from_file(TemporalConfig(address="t:7233", api_key_file=key)) == "sk-123"
    assert api_key_from_file(TemporalConfig(address="t:7233")) is None
    with pytest.raises(TemporalSecurityError, match=r"temporal.api_key_file: cannot read .*missing"):
        api_key_from_file(TemporalConfig(address="t:7233", api_key_file=tmp_path / "missing"))
    key.write_text("  \n")
    with pytest.raises(TemporalSecurityError, match=r"temporal.api_key_file: .* is empty"):
        api_key_from_file(TemporalConfig(address="t:7233", api_key_file=key))


def test_api_key_env_and_api_key_file_are_one_or_the_other() -> None:
    keyed = TemporalConfig(address="t:7233", api_key_file=Path("/k"))
    assert keyed.secured and keyed.has_api_key and not keyed.without_security().secured
    with pytest.raises(ValueError, match="api_key_env or api_key_file, not both"):
        TemporalConfig(address="t:7233", api_key_env="K", api_key_file=Path("/k"))
