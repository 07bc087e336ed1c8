"""The layering: import-linter's contracts (pyproject.toml, `[tool.importlinter]`) hold.

`make test` runs `lint-imports` before pytest; this test runs it too, so that a `make test` with any
PYTEST_ARGS, or a bare `pytest`, still checks what may import what.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO


@pytest.mark.integration  # runs lint-imports as a process
def test_the_import_contracts_hold() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_every_package_is_in_the_wheel() -> None:
    """`[tool.setuptools] packages` lists packages one by one (each top-level folder maps onto `rollart.*`), so a
    new subpackage left out of it would be missing from a wheel while an editable install still finds it."""
    import tomllib

    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    # every top-level folder that is a package maps onto rollart.*, but the benchmarks and the tests
    dirs = {
        f"rollart.{init.parent.name}": init.parent.name
        for init in REPO.glob("*/__init__.py")
        if init.parent.name not in ("bench", "tests")
    }
    assert {"rollart.spec", "rollart.workflows", "rollart.simulator"} <= set(dirs)
    assert setuptools["package-dir"] == dirs
    found = {
        ".".join(("rollart", *init.parent.relative_to(REPO).parts))
        for folder in dirs.values()
        for init in (REPO / folder).rglob("__init__.py")
    }
    assert found == set(setuptools["packages"]), f"missing: {found - set(setuptools['packages'])}"


def test_no_contract_carries_an_exception() -> None:
    """A contract with ignored imports says one thing and allows another: a needed import changes the contract
    (or moves the code) instead, so every rule in pyproject.toml reads as it holds."""
    import tomllib

    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    excepted = [c["name"] for c in contracts if c.get("ignore_imports")]
    assert not excepted, f"contracts with ignore_imports: {excepted}"
