"""The workflow `python -m bench resets` drives: one episode's start (its reset) after another, through the rollout
driver's Temporal calls — exactly as a trajectory makes it, with the reset's retry policy.

Kept apart from bench/resets.py so the workflow sandbox imports nothing heavy.
"""

from __future__ import annotations

from pydantic import BaseModel
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from rollart.contracts.rollouts import TrajectoryInput
    from rollart.spec.config import TaskSpec
    from rollart.workflows.driver.calls import CallFailed
    from rollart.workflows.driver.episode import Episode
    from rollart.workflows.temporal_calls import TemporalCalls

__all__ = ["ResetBenchInput", "ResetBenchResult", "ResetBenchWorkflow"]


class ResetBenchInput(BaseModel):
    task: TaskSpec
    seeds: list[int]


class ResetBenchResult(BaseModel):
    ok: int
    failed: int
    latencies_s: list[float]  # workflow view: from scheduling the reset to its result (retries included)
    errors: list[str]


@workflow.defn(name="ResetBenchWorkflow")
class ResetBenchWorkflow:
    @workflow.run
    async def run(self, inp: ResetBenchInput) -> ResetBenchResult:
        base, calls = workflow.info().workflow_id, TemporalCalls()
        out = ResetBenchResult(ok=0, failed=0, latencies_s=[], errors=[])
        for seed in inp.seeds:
            ep = Episode(calls, TrajectoryInput(task=inp.task, seed=seed), f"{base}-{seed}")
            t0 = workflow.time()
            try:
                await ep.start()
                out.ok += 1
                out.latencies_s.append(workflow.time() - t0)
            except CallFailed as err:
                out.failed += 1
                out.errors.append(err.message)
        return out
