"""Worker options from `WorkerTuning`: pollers, the workflow cache and the workflow runner, one place for every worker.

The replay test builds its Replayer with `workflow_runner()` too, so the runners workers may use are the ones
whose determinism the recorded histories check.
"""

from __future__ import annotations

from typing import Any

from temporalio.worker import (
    PollerBehavior,
    PollerBehaviorAutoscaling,
    PollerBehaviorSimpleMaximum,
    UnsandboxedWorkflowRunner,
    WorkflowRunner,
)
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from rollart.spec.config import WorkerTuning

__all__ = [
    "SANDBOX_PASSTHROUGH",
    "activity_worker_options",
    "poller_behavior",
    "workflow_runner",
    "workflow_worker_options",
]


def workflow_worker_options(tuning: WorkerTuning) -> dict[str, Any]:
    """`Worker` keyword arguments for the worker that runs workflows (the control pool)."""
    return {
        "workflow_task_poller_behavior": poller_behavior(tuning, tuning.workflow_task_pollers),
        "max_cached_workflows": tuning.max_cached_workflows,
        "max_concurrent_workflow_tasks": tuning.max_concurrent_workflow_tasks,
        "workflow_runner": workflow_runner(tuning),
    }


def activity_worker_options(tuning: WorkerTuning) -> dict[str, Any]:
    """`Worker` keyword arguments for a worker that runs activities only."""
    return {"activity_task_poller_behavior": poller_behavior(tuning, tuning.activity_task_pollers)}


def poller_behavior(tuning: WorkerTuning, most: int) -> PollerBehavior:
    """`most` polls a queue, always (`fixed`), or as many as the server's feedback asks for up to `most`."""
    if tuning.pollers == "autoscaling":
        return PollerBehaviorAutoscaling(minimum=1, maximum=most, initial=min(5, most))
    return PollerBehaviorSimpleMaximum(maximum=most)


# Modules the sandbox passes through as well SDK's own list. beartype: a dependency that calls
# `beartype_this_package()` (fastmcp's key_value, which OpenEnv's server imports) installs an import hook that, on
# every import, looks up beartype's own state in sys.modules; inside a sandbox that is not there, so each new
# workflow re-imported beartype's machinery (orchestration tests ran 3x slower once OpenEnv had been imported).
SANDBOX_PASSTHROUGH = ("beartype",)


def workflow_runner(tuning: WorkerTuning) -> WorkflowRunner:
    """The runner `tuning.sandbox` names: the SDK's sandbox, or none."""
    if tuning.sandbox != "strict":
        return UnsandboxedWorkflowRunner()
    return SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules(*SANDBOX_PASSTHROUGH)
    )
