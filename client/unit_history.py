"""What a rollout unit's history says of its trajectories: its input (the task claim joined back), and its results.

A unit (a TrajectoryWorkflow, or a group or batch of them) started by a training workflow reports each result by
signal and returns only what it could not deliver (workflows/reporting.py); one a client started returns them all.
Its results are therefore in its history either way: in the report signals it sent, or in how it completed.
"""

from __future__ import annotations

from typing import Any

from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHistory

from rollart.contracts.rollouts import (
    BatchRolloutInput,
    GroupRolloutArgs,
    GroupRolloutInput,
    TrajectoryArgs,
    TrajectoryInput,
    TrajectoryResult,
)
from rollart.spec.config import TaskSpec

__all__ = ["ROLLOUT_INPUTS", "results_of", "unit_input", "unit_results"]

ROLLOUT_INPUTS: dict[str, Any] = {
    "TrajectoryWorkflow": TrajectoryInput | TrajectoryArgs,
    "GroupRolloutWorkflow": GroupRolloutInput | GroupRolloutArgs,
    "BatchRolloutWorkflow": BatchRolloutInput,
}
"""Each rollout workflow's first argument: whole, or (started by a training workflow) without its task, which
is the second."""

_DECODE_ERRORS = (ValueError, TypeError, RuntimeError, KeyError)  # a payload of another shape: shown without it


async def unit_input(client: Client, history: WorkflowHistory, wf_type: str) -> Any:
    """The unit's whole input (`TrajectoryInput`, `GroupRolloutInput` or `BatchRolloutInput`); None when it cannot
    be read (an older or newer contract)."""
    payloads = history.events[0].workflow_execution_started_event_attributes.input.payloads
    if wf_type not in ROLLOUT_INPUTS or not payloads:
        return None
    hints = [ROLLOUT_INPUTS[wf_type], TaskSpec][: len(payloads)]
    try:
        args = await client.data_converter.decode(payloads, hints)
    except _DECODE_ERRORS:
        return None
    first = args[0]
    if isinstance(first, TrajectoryArgs | GroupRolloutArgs):  # a batch carries its tasks inline
        return first.with_task(args[1] if len(args) > 1 else None)
    return first


async def unit_results(client: Client, events: list[HistoryEvent]) -> list[TrajectoryResult]:
    """Every result the unit reported or returned, once each, in the order it sent them."""
    decode = client.data_converter.decode
    found: dict[str, TrajectoryResult] = {}
    for e in events:
        if e.HasField("signal_external_workflow_execution_initiated_event_attributes"):
            payloads = e.signal_external_workflow_execution_initiated_event_attributes.input.payloads
        elif e.HasField("workflow_execution_completed_event_attributes"):
            payloads = e.workflow_execution_completed_event_attributes.result.payloads
        else:
            continue
        for r in await _results(decode, payloads):
            found.setdefault(r.trajectory_id, r)
    return list(found.values())


async def results_of(client: Client, workflow_id: str, run_id: str | None = None) -> list[TrajectoryResult]:
    """`unit_results` of one unit's workflow, read from the server."""
    history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    return await unit_results(client, list(history.events))


async def _results(decode: Any, payloads: Any) -> list[TrajectoryResult]:
    if not payloads:
        return []
    try:
        (value,) = await decode(payloads, [TrajectoryResult | list[TrajectoryResult] | None])
    except _DECODE_ERRORS:
        return []
    return [] if value is None else value if isinstance(value, list) else [value]
