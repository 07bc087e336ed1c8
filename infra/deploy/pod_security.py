"""What every rendered pod runs as: the Pod Security Standards' "restricted" profile, and the few writable dirs.

The images (docker/Dockerfile.*) run as the `rollart` user (uid and gid `IMAGE_UID`/`IMAGE_GID`) over code and a
venv that root owns, so a process cannot change what it runs. Pods say so again (non-root, that uid, no privilege
escalation, no capabilities, the runtime's seccomp profile) and mount the root filesystem read-only; what the
processes do write gets an emptyDir of its own (`scratch_volumes`): /tmp (tempfile, torch's inductor), HOME (the
HF, vLLM, Triton and FlashInfer caches under ~/.cache, ~/.triton) and the working dir's `.rollart` (the job's
default `model_dir`, where workers build the tiny models on first use). The shared volumes (store, run dir) are
group-writable for `IMAGE_GID` through `fsGroup`.
"""

from __future__ import annotations

from typing import Any

from rollart.spec.config.kubernetes import KubernetesConfig

__all__ = [
    "IMAGE_GID",
    "IMAGE_HOME",
    "IMAGE_UID",
    "IMAGE_WORKDIR",
    "container_security_context",
    "pod_security_context",
    "scratch_volumes",
]

IMAGE_UID = 10001
"""The uid of the `rollart` user the images run as (docker/Dockerfile.*)."""

IMAGE_GID = 10001
"""Its group: pods mount volumes writable for it (`fsGroup`)."""

IMAGE_HOME = "/home/rollart"
"""Its HOME (the images' `ENV HOME`): the caches of Hugging Face, vLLM, Triton, FlashInfer live below it."""

IMAGE_WORKDIR = "/opt/rollart"
"""The images' working dir (root-owned code): the job's relative paths (`.rollart/...`) resolve below it."""

_RUNTIME_DEFAULT = {"type": "RuntimeDefault"}


def pod_security_context() -> dict[str, Any]:
    """The pod's half of "restricted": non-root as the image's user, seccomp on, volumes group-owned by its group.

    `OnRootMismatch`: the store and run dir are chowned once, not walked at every pod start.
    """
    return {
        "runAsNonRoot": True,
        "runAsUser": IMAGE_UID,
        "runAsGroup": IMAGE_GID,
        "fsGroup": IMAGE_GID,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": dict(_RUNTIME_DEFAULT),
    }


def container_security_context(cfg: KubernetesConfig) -> dict[str, Any]:
    """The container's half: no privilege escalation, no capabilities, read-only root unless the job opts out."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": cfg.read_only_root_filesystem,
        "seccompProfile": dict(_RUNTIME_DEFAULT),
    }


def scratch_volumes(mounts: list[dict[str, Any]], volumes: list[dict[str, Any]]) -> None:
    """Add the emptyDirs a process writes to beside a read-only root: /tmp, HOME, and the working dir's .rollart.

    Per pod and gone with it, like the container's own layer they replace.
    """
    for name, path in (("tmp", "/tmp"), ("home", IMAGE_HOME), ("rollart-home", f"{IMAGE_WORKDIR}/.rollart")):
        mounts.append({"name": name, "mountPath": path})
        volumes.append({"name": name, "emptyDir": {}})
