"""Determinism: histories recorded from real runs replay on today's workflow code.

A change that alters the command sequence of a running trajectory (an added
activity, a reordered call) fails here; then it needs `workflow.patched()`
or a new workflow type, not an edit in place.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from rollart.infra.config import WorkerTuning
from rollart.infra.worker_tuning import workflow_runner
from rollart.workflows import ALL_WORKFLOWS

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


def test_recorded_histories_exist() -> None:
    names = {p.stem for p in HISTORIES}
    assert {
        "trajectory-completed",
        "trajectory-env-broken",
        "trajectory-invalid-input",
        "trajectory-unknown-env",
        "group-multi-turn",
        "group-multi-turn-close-while-scoring",
        "group-single-turn",
        "group-single-turn-wave",
        "training-continued-as-new",
        "training-dynamic-sampling",
        # recorded since the patch ui-summary: rollout workflows upsert their outcome's search attributes
        "trajectory-ui-summary",
        "trajectory-failed-ui-summary",
        "group-multi-turn-ui-summary",
        "group-single-turn-ui-summary",
        "batch-ui-summary",
        "training-ui-summary",
    } <= names


@pytest.mark.parametrize("sandbox", ["strict", "off"])
@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: p.stem)
async def test_recorded_history_replays(path: Path, sandbox: str) -> None:
    """Under each workflow runner a worker may be configured with (`temporal.workers.sandbox`)."""
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    runner = workflow_runner(WorkerTuning(sandbox=sandbox))
    replayer = Replayer(workflows=ALL_WORKFLOWS, data_converter=pydantic_data_converter, workflow_runner=runner)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure
