"""TrajectoryWorkflow: one agentic episode, reset → (generate → step)* → reward → close.

Each activity goes to its pool's queue: reset to the env pool ("cpu"), generate to the task's generation
pool, step/close to the private queue of the env worker holding the session (sticky), reward to
"serverless". The calls and their failure handling are the rollout driver's (workflows/driver).
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from rollart.contracts.rollouts import TrajectoryInput, TrajectoryResult
    from rollart.workflows.driver.episode import Episode
    from rollart.workflows.driver.lockstep import play
    from rollart.workflows.reporting import TRAJECTORIES_DONE, report, reporter
    from rollart.workflows.temporal_calls import TemporalCalls
    from rollart.workflows.ui_summary import show_outcome

__all__ = ["TRAJECTORIES_DONE", "TrajectoryWorkflow", "report"]


@workflow.defn(name="TrajectoryWorkflow", failure_exception_types=[ValidationError])
class TrajectoryWorkflow:
    """Runs one episode; a broken env or worker ends it as `failed` (never scored), bad input fails the workflow."""

    def __init__(self) -> None:
        self._episode: Episode | None = None

    @workflow.query(name="turns")
    def turns(self) -> int:
        """How many turns have been played so far."""
        return len(self._episode.turns) if self._episode else 0

    @workflow.run
    async def run(self, inp: TrajectoryInput) -> TrajectoryResult:
        self._episode = Episode(TemporalCalls(), inp, inp.trajectory_id or workflow.info().workflow_id)
        [result] = await play([self._episode], reporter(inp.report_to))
        show_outcome([result])
        return result
