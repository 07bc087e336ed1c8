"""A workflow for worker tests: one `reset` activity on a given env queue, so a test sees an env worker serve."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from rollart.contracts.activities import EnvHandle, ResetInput


@workflow.defn(name="OneReset")
class OneReset:
    """Resets FrozenLake once on `queue` and returns the session's handle (the worker that holds it)."""

    @workflow.run
    async def run(self, queue: str) -> EnvHandle:
        inp = ResetInput(
            env="frozenlake", env_args={"maps": "standard"}, seed=0, trajectory_id=workflow.info().workflow_id
        )
        return await workflow.execute_activity(
            "reset",
            inp,
            task_queue=queue,
            result_type=EnvHandle,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=20),
        )
