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
