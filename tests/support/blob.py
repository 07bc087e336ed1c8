"""A workflow that moves a large payload through an activity and its own result: for external payload storage tests."""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow

__all__ = ["BlobWorkflow", "make_blob"]


@activity.defn(name="make_blob")
async def make_blob(kib: int) -> str:
    """`kib` KiB of text."""
    return "x" * (kib * 1024)


@workflow.defn(name="BlobWorkflow")
class BlobWorkflow:
    """Passes a large activity result through workflow state into the workflow result."""

    @workflow.run
    async def run(self, kib: int) -> str:
        blob = await workflow.execute_activity(
            "make_blob", kib, start_to_close_timeout=timedelta(seconds=30), result_type=str
        )
        return blob + "!"
