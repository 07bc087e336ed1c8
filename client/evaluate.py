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

from rollart.activities.engines.hf_engine import HfEngine
from rollart.client.in_process import in_process_activities, play_unit
from rollart.client.rollout import rollout_units
from rollart.contracts.ids import EVAL_SEED_BASE
from rollart.contracts.rollouts import TrajectoryInput
from rollart.infra.config import JobSpec, TaskSpec
from rollart.infra.store.payload import StoreKeyError, open_store
from rollart.infra.store.weights import WeightsSource, latest_weights, manifest_key, read_manifest

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
    job: JobSpec, task: TaskSpec, job_id: str | None, version: int | None, episodes: int, temperature: float = 0.0
) -> EvalReport:
    """Play `episodes` held-out episodes of `task` with the job's policy `version` (None: latest; no job id: v0).

    The episodes run through the rollout driver with the activity code in this process (one at a time), each in
    the unit training plays the task in (infra/routing.py), as a group of one: the same env, generation and
    reward calls as in training, only greedy and on seeds training never draws (`EVAL_SEED_BASE`).
    """
    engine = HfEngine.from_config(job.model_dir, job.engine)
    await engine.start()
    sampling = task.sampling.model_copy(update={"temperature": temperature, "n": 1})
    greedy = task.model_copy(update={"sampling": sampling, "group_size": 1})
    inputs = [TrajectoryInput(task=greedy, seed=EVAL_SEED_BASE + i) for i in range(episodes)]
    try:
        version = await _load_version(engine, job, job_id, version)
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


async def _load_version(engine: HfEngine, job: JobSpec, job_id: str | None, version: int | None) -> int:
    if job_id is None:
        return 0
    store = open_store(job.store)
    if version is None:
        latest = latest_weights(store, job_id)
        if latest is None:
            raise ValueError(f"job {job_id!r} has published no weights in {store!r}")
        version = latest.version
    if version == 0:
        return 0
    try:
        manifest = read_manifest(store, manifest_key(job_id, version))
    except StoreKeyError as e:
        raise ValueError(f"job {job_id!r} has no published v{version} in {store!r}: {e}") from e
    await engine.load_weights(WeightsSource(store=store.config, manifest=manifest), version)
    return version
