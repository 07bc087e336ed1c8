"""`rollart.sdk`: the one import a user's env or reward needs, and the names the docs write against."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import rollart.sdk as sdk
from rollart.spec.env import Env
from rollart.spec.registry import env

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_the_sdk_names_are_the_definitions_themselves() -> None:
    assert sdk.Env is Env and sdk.env is env  # one class, one registry: not copies
    assert all(hasattr(sdk, name) for name in sdk.__all__)


def test_the_docs_write_envs_against_the_sdk_alone() -> None:
    """Code in the docs imports rollart's user-facing names from `rollart.sdk` only, and every name exists there."""
    for page in sorted(DOCS.glob("*.md")):
        for block in re.findall(r"```python\n(.*?)```", page.read_text(), re.S):
            for module, names in re.findall(r"^from (rollart[\w.]*) import (.+)$", block, re.M):
                assert module == "rollart.sdk", f"{page.name}: `from {module} import ...`: use rollart.sdk"
                missing = [n.strip() for n in names.split(",") if not hasattr(sdk, n.strip())]
                assert not missing, f"{page.name}: rollart.sdk has no {missing}"


@pytest.mark.integration
def test_importing_the_sdk_loads_no_torch_vllm_or_worker() -> None:
    heavy = ["torch", "vllm", "transformers", "temporalio.worker"]
    code = f"import sys, rollart.sdk; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"
