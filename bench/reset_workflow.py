"""The workflow `python -m bench resets` drives: one `Episode.reset` after another, exactly as a trajectory calls it.

Kept apart from bench/resets.py so the workflow sandbox imports nothing heavy.
"""

from __future__ import annotations

from pydantic import BaseModel
from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from rollart.infra.config import TaskSpec
    from rollart.workflows.episode import Episode, describe
    from rollart.contracts.rollouts import TrajectoryInput

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
        base = workflow.info().workflow_id
        out = ResetBenchResult(ok=0, failed=0, latencies_s=[], errors=[])
        for seed in inp.seeds:
            ep = Episode(inp=TrajectoryInput(task=inp.task, seed=seed), trajectory_id=f"{base}-{seed}")
            t0 = workflow.time()
            try:
                await ep.reset()
                out.ok += 1
                out.latencies_s.append(workflow.time() - t0)
            except ActivityError as err:
                out.failed += 1
                out.errors.append(describe(err))
        return out
