"""The released version, stated once in pyproject.toml: what `rollart --version` prints and the images are tagged."""

from __future__ import annotations

import tomllib

import pytest

from rollart.spec.config.kubernetes import DEFAULT_CPU_IMAGE, DEFAULT_GPU_IMAGE
from tests.support.cli import rollart
from tests.support.paths import REPO


def test_version_is_the_released_one_everywhere(capsys: pytest.CaptureFixture[str]) -> None:
    """`rollart --version` prints the installed package's version, which is pyproject's; the images are tagged so."""
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    done = rollart(capsys, "--version")
    assert (done.returncode, done.stdout) == (0, f"rollart {version}\n")
    assert [f"rollart:{version}-{kind}" for kind in ("cpu", "gpu")] == [DEFAULT_CPU_IMAGE, DEFAULT_GPU_IMAGE]
    makefile = (REPO / "Makefile").read_text()
    assert f"IMAGE_CPU ?= {DEFAULT_CPU_IMAGE}" in makefile and f"IMAGE_GPU ?= {DEFAULT_GPU_IMAGE}" in makefile
