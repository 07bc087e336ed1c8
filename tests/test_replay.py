"""Determinism: histories recorded from real runs replay on today's workflow code, and every patch is deliberate.

A change that alters the command sequence of a workflow (an added activity, a reordered call) fails here.
Before a release, re-record the fixtures from today's code (`python -m tests.support.record_histories`);
from 0.1.0 on, a change to a released workflow's command sequence needs `workflow.patched(id)`, the id in
workflows/patches.py, and the fixture recorded before it stays (docs/development.md, "Versioning workflows").
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from rollart.infra.temporal.worker_tuning import workflow_runner
from rollart.spec.config import WorkerTuning
from rollart.workflows import ALL_WORKFLOWS
from rollart.workflows.patches import RELEASED_PATCHES
from tests.support.record_histories import FIXTURES, RECORDERS

ROOT = Path(__file__).resolve().parent.parent
HISTORIES = sorted((ROOT / "tests" / "histories").glob("*.json"))
SOURCES = ("workflows", "activities", "workers", "infra", "client", "cli", "contracts")
"""rollart's packages: a patch call anywhere in them counts (only workflow code should have one)."""
PATCH_CALLS = {"patched": "patched", "deprecate_patch": "deprecated"}


def test_recorded_histories_exist() -> None:
    assert set(FIXTURES) <= {p.stem for p in HISTORIES}
    assert sorted(n for names in RECORDERS.values() for n in names) == sorted(FIXTURES)  # each has its recorder


@pytest.mark.parametrize("sandbox", ["strict", "off"])
@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: p.stem)
async def test_recorded_history_replays(path: Path, sandbox: str) -> None:
    """Under each workflow runner a worker may be configured with (`temporal.workers.sandbox`)."""
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    runner = workflow_runner(WorkerTuning(sandbox=sandbox))
    replayer = Replayer(workflows=ALL_WORKFLOWS, data_converter=pydantic_data_converter, workflow_runner=runner)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure


def patch_calls(files: list[Path]) -> tuple[dict[str, str], list[str]]:
    """Every `patched(id)` / `deprecate_patch(id)` in `files`: id → state, and what cannot be read as one.

    The id must be a string literal or a module-level string constant, so that it can be listed; any other use
    of those names (an alias, a computed id) is reported as a problem.
    """
    found: dict[str, str] = {}
    problems: list[str] = []
    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        constants = {
            t.id: node.value.value
            for node in tree.body
            if isinstance(node, ast.Assign | ast.AnnAssign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(t, ast.Name)
        }
        called = set()
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name not in PATCH_CALLS:
                continue
            called.add(id(node.func))
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found[arg.value] = PATCH_CALLS[name]
            elif isinstance(arg, ast.Name) and arg.id in constants:
                found[constants[arg.id]] = PATCH_CALLS[name]
            else:
                problems.append(f"{path}:{node.lineno}: {name}(...) with an id that is no literal or module constant")
        for node in ast.walk(tree):
            name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
            if name in PATCH_CALLS and id(node) not in called and not isinstance(node, ast.alias):
                problems.append(f"{path}:{node.lineno}: {name} used other than as a call with its id")
    return found, problems


def test_patch_ids_are_deliberate() -> None:
    """The patch calls in the code are exactly the ones workflows/patches.py declares, in their declared state:
    a new patch, a deprecation or a removal is an edit there too (and a fixture kept, see the module)."""
    files = sorted(f for d in SOURCES for f in (ROOT / d).rglob("*.py"))
    assert files, ROOT
    found, problems = patch_calls(files)
    assert not problems, problems
    assert found == RELEASED_PATCHES, (
        f"patch calls in the code {found} differ from workflows/patches.py's RELEASED_PATCHES {RELEASED_PATCHES}: "
        "declare a new one there (patched only across released versions), or update its state"
    )


def test_the_patch_scan_sees_every_form(tmp_path: Path) -> None:
    """What `test_patch_ids_are_deliberate` counts: literal and constant ids, both calls, and misuse."""
    source = tmp_path / "wf.py"
    source.write_text(
        "from temporalio import workflow\n"
        'NEW = "new-path"\n'
        "def run(calls, x):\n"
        '    if workflow.patched("a"):\n'
        "        workflow.deprecate_patch(NEW)\n"
        "    calls.patched(x)\n"
        "    check = workflow.patched\n"
    )
    found, problems = patch_calls([source])
    assert found == {"a": "patched", "new-path": "deprecated"}
    assert [p.split(": ", 1)[1] for p in problems] == [
        "patched(...) with an id that is no literal or module constant",
        "patched used other than as a call with its id",
    ]
