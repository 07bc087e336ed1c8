"""`rollart eval`: a policy version's success rate on held-out seeds, decoded greedily, in one process.

Why: the success rate `rollart train` reports is measured on the training samples, drawn at the
task's temperature (exploration noise included). What a policy *knows* is its greedy answer —
what RL frameworks report as validation accuracy. This plays the task's own env, reward and a
transformers engine in this process (no Temporal, no workers), on seeds the training loop never
draws, with the untrained model (version 0) or any published version.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from rollart.activities.engines.hf_engine import HfEngine
from rollart.client.in_process import in_process_activities, play_unit
from rollart.client.rollout import rollout_units
from rollart.client.snapshots import from_checkpoint, from_store, load_into
from rollart.contracts.ids import EVAL_SEED_BASE
from rollart.contracts.rollouts import TrajectoryInput
from rollart.infra.store.payload import open_store
from rollart.spec.config import JobSpec, TaskSpec

__all__ = ["EvalReport", "evaluate"]


@dataclass(frozen=True)
class EvalReport:
    """Greedy (or sampled) success of one policy version on one task; failed episodes are not counted in."""

    task: str
    version: int
    episodes: int
    success_rate: float
    reward_mean: float
    temperature: float
    failed: int = 0


async def evaluate(
    job: JobSpec,
    task: TaskSpec,
    job_id: str | None,
    version: int | None,
    episodes: int,
    temperature: float = 0.0,
    *,
    checkpoint: Path | None = None,
    step: int | None = None,
) -> EvalReport:
    """Play `episodes` held-out episodes of `task` with the job's policy `version` (None: latest; no job id: v0),
    or the one `checkpoint` holds (a run dir's newest, or step `step`'s; a checkpoint dir). A LoRA job's
    versions are its adapters, served on the model dir's weights.

    The episodes run through the rollout driver with the activity code in this process (one at a time), each in
    the unit training plays the task in (spec/routing.py), as a group of one: the same env, generation and
    reward calls as in training, only greedy and on seeds training never draws (`EVAL_SEED_BASE`).
    """
    if task.is_agent:  # its turns are updates of a trajectory workflow, served by an env worker's endpoint
        raise ValueError(
            f"task {task.name!r} is played by an agent program, whose chat requests need a Temporal server and the "
            "env workers' endpoint: `rollart rollout` plays it (rollart eval plays episodes in this process)"
        )
    engine = HfEngine.from_config(job.model_dir, job.engine)
    await engine.start()
    sampling = task.sampling.model_copy(update={"temperature": temperature, "n": 1})
    greedy = task.model_copy(update={"sampling": sampling, "group_size": 1})
    inputs = [TrajectoryInput(task=greedy, seed=EVAL_SEED_BASE + i) for i in range(episodes)]
    try:
        version = await _load_version(engine, job, job_id, version, checkpoint, step)
        async with in_process_activities(engine, job.model_dir) as calls:
            results = []
            for first, members in rollout_units(inputs):
                results += await play_unit(calls, first, members, "eval")
    finally:
        await engine.shutdown()
    scored = [r for r in results if r.status == "completed"]
    if not scored:
        raise RuntimeError(f"every eval episode of task {task.name!r} failed; the first: {results[0].error}")
    return EvalReport(
        task=task.name,
        version=version,
        episodes=len(scored),
        temperature=temperature,
        success_rate=statistics.fmean(float(bool(r.success)) for r in scored),
        reward_mean=statistics.fmean(r.reward or 0.0 for r in scored),
        failed=len(results) - len(scored),
    )


async def _load_version(
    engine: HfEngine, job: JobSpec, job_id: str | None, version: int | None, checkpoint: Path | None, step: int | None
) -> int:
    if checkpoint is not None:
        snapshot = from_checkpoint(checkpoint, step)
    elif job_id is None:
        return 0
    else:
        snapshot = from_store(open_store(job.store), job_id, version)
        if snapshot is None:
            return 0
    await load_into(engine, snapshot)
    return snapshot.version
