"""Worker options from `WorkerTuning`: pollers, the workflow cache and the workflow runner, one place for every worker.

The replay test builds its Replayer with `workflow_runner()` too, so the runners workers may use are the ones
whose determinism the recorded histories check.
"""

from __future__ import annotations

from typing import Any

from temporalio.worker import PollerBehaviorSimpleMaximum, UnsandboxedWorkflowRunner, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from rollart.spec.config import WorkerTuning

__all__ = ["SANDBOX_PASSTHROUGH", "activity_worker_options", "workflow_runner", "workflow_worker_options"]


def workflow_worker_options(tuning: WorkerTuning) -> dict[str, Any]:
    """`Worker` keyword arguments for the worker that runs workflows (the control pool)."""
    return {
        "workflow_task_poller_behavior": PollerBehaviorSimpleMaximum(maximum=tuning.workflow_task_pollers),
        "max_cached_workflows": tuning.max_cached_workflows,
        "max_concurrent_workflow_tasks": tuning.max_concurrent_workflow_tasks,
        "workflow_runner": workflow_runner(tuning),
    }


def activity_worker_options(tuning: WorkerTuning) -> dict[str, Any]:
    """`Worker` keyword arguments for a worker that runs activities only."""
    return {"activity_task_poller_behavior": PollerBehaviorSimpleMaximum(maximum=tuning.activity_task_pollers)}


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
