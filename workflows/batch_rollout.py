"""BatchRolloutWorkflow: the synchronous baseline — a batch of episodes in lockstep, turn by turn.

All resets, then every live episode's generation, then every step, and so on
until all are over; then all rewards. This is the veRL-style loop that rollart
is measured against: the same activities on the same pools, only with a
barrier after every phase, so the slowest env or answer holds up the batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError
    from rollart.workflows.episode import BAD_INPUT_TYPES, Episode, describe, error_type, reject_multi_sample
    from rollart.workflows.trajectory import report
    from rollart.contracts.rollouts import BatchRolloutInput, TrajectoryInput, TrajectoryResult

__all__ = ["BatchRolloutWorkflow"]

T = TypeVar("T")


@workflow.defn(name="BatchRolloutWorkflow", failure_exception_types=[ValidationError])
class BatchRolloutWorkflow:
    """Runs every episode phase by phase; an episode that fails drops out, the batch goes on."""

    @workflow.run
    async def run(self, inp: BatchRolloutInput) -> list[TrajectoryResult]:
        for t in inp.trajectories:
            reject_multi_sample(t)
        base = workflow.info().workflow_id
        self._episodes = [Episode(inp=t, trajectory_id=f"{base}-{i:03d}") for i, t in enumerate(inp.trajectories)]
        self._failed: dict[int, str] = {}
        try:
            await self._phase(self._alive(), lambda i: self._episodes[i].reset())
            while live := [i for i in self._alive() if not self._episodes[i].over]:
                gens = await self._phase(live, lambda i: self._episodes[i].generate())
                await self._phase(list(gens), lambda i: self._episodes[i].step(gens[i]))
            scores = await self._phase(self._alive(), lambda i: self._episodes[i].score())
        finally:
            await asyncio.gather(*(ep.close() for ep in self._episodes))
        results = [
            ep.result(status="failed", error=self._failed[i]) if i in self._failed
            else ep.result(status="completed", reward=scores[i].value, success=scores[i].success)
            for i, ep in enumerate(self._episodes)
        ]  # fmt: skip
        await report(inp.report_to, results)
        return results

    def _alive(self) -> list[int]:
        return [i for i in range(len(self._episodes)) if i not in self._failed]

    async def _phase(self, live: list[int], call: Callable[[int], Awaitable[T]]) -> dict[int, T]:
        """Run `call` for every live episode at once (the barrier); failures drop episodes out."""
        outcomes = await asyncio.gather(*(call(i) for i in live), return_exceptions=True)
        done: dict[int, T] = {}
        for i, out in zip(live, outcomes):
            if isinstance(out, ActivityError):
                if error_type(out) in BAD_INPUT_TYPES:
                    raise ApplicationError(describe(out), type=error_type(out), non_retryable=True) from out
                self._failed[i] = describe(out)
            elif isinstance(out, BaseException):
                raise out
            else:
                done[i] = out
        return done
