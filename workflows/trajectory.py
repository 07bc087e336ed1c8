"""TrajectoryWorkflow: one agentic episode, reset → (generate → step)* → reward → close.

Each activity goes to its pool's queue: reset to "cpu", generate to the task's
generation pool, step/close to the private queue of the env worker holding the
session (sticky), reward to "serverless". Deterministic: no I/O, no clock, no
heavy imports — only names and pydantic types cross into this module.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError
    from rollart.workflows.episode import BAD_INPUT_TYPES, Episode, describe, error_type, reject_multi_sample
    from rollart.contracts.rollouts import TrajectoryInput, TrajectoryResult

__all__ = ["TRAJECTORIES_DONE", "TrajectoryWorkflow", "report"]

TRAJECTORIES_DONE = "trajectories_done"
"""The signal a finished trajectory (or lockstep batch) sends to the workflow named in `report_to`."""


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
        reject_multi_sample(inp)
        ep = self._episode = Episode(inp=inp, trajectory_id=workflow.info().workflow_id)
        try:
            await ep.reset()
            while not ep.over:
                await ep.step(await ep.generate())
            score = await ep.score()
            result = ep.result(status="completed", reward=score.value, success=score.success)
        except ActivityError as err:
            if error_type(err) in BAD_INPUT_TYPES:
                raise ApplicationError(describe(err), type=error_type(err), non_retryable=True) from err
            workflow.logger.warning("trajectory %s failed: %s", ep.trajectory_id, describe(err))
            result = ep.result(status="failed", error=describe(err))
        finally:
            await ep.close()
        await report(inp.report_to, [result])
        return result


async def report(report_to: str | None, results: list[TrajectoryResult]) -> None:
    """Signal finished trajectories to the training workflow (by id: it reaches its latest run)."""
    if not report_to:
        return
    try:
        await workflow.get_external_workflow_handle(report_to).signal(TRAJECTORIES_DONE, results)
    except Exception as err:  # the training workflow is gone (stopped, terminated): nothing to report to
        workflow.logger.warning("could not report %d trajectories to %s: %s", len(results), report_to, err)
