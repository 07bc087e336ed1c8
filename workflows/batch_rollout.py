"""BatchRolloutWorkflow: the synchronous baseline — a batch of episodes in lockstep, turn by turn.

All resets, then every live episode's generation, then every step, and so on until all are over; then all
rewards. This is the veRL-style loop that rollart is measured against: the same activities on the same
pools, only with a barrier after every phase, so the slowest env or answer holds up the batch.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from rollart.contracts.ids import batch_member_id
    from rollart.contracts.rollouts import BatchRolloutInput, TrajectoryResult
    from rollart.workflows.driver.episode import Episode
    from rollart.workflows.driver.lockstep import play
    from rollart.workflows.reporting import Reporter
    from rollart.workflows.temporal_calls import TemporalCalls
    from rollart.workflows.ui_summary import show_outcome

__all__ = ["BatchRolloutWorkflow"]


@workflow.defn(name="BatchRolloutWorkflow", failure_exception_types=[ValidationError])
class BatchRolloutWorkflow:
    """Runs every episode phase by phase; an episode that fails drops out, the batch goes on."""

    @workflow.run
    async def run(self, inp: BatchRolloutInput) -> list[TrajectoryResult]:
        calls, base = TemporalCalls(), workflow.info().workflow_id
        episodes = [
            Episode(calls, t, t.trajectory_id or batch_member_id(base, i)) for i, t in enumerate(inp.trajectories)
        ]
        send = Reporter(inp.report_to)
        results = await play(episodes, send)
        show_outcome(results)
        return send.undelivered
