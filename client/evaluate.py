"""`rollart eval`: a policy version's success rate on held-out seeds, decoded greedily, in one process.

Why: the success rate `rollart train` reports is measured on the training samples, drawn at the
task's temperature (exploration noise included). What a policy *knows* is its greedy answer —
what RL frameworks report as validation accuracy. This plays the task's own env, reward and a
transformers engine in this process (no Temporal, no workers), on seeds the training loop never
draws, with the untrained model (version 0) or any published version.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rollart.activities.engines.hf_engine import HfEngine
from rollart.activities.reward import as_reward_result
from rollart.contracts.activities import Transcript, TurnRecord
from rollart.infra.config import JobSpec, TaskSpec
from rollart.infra.registry import lookup_env, lookup_reward
from rollart.infra.store import StoreKeyError, open_store
from rollart.infra.weights import latest_weights, weights_key

__all__ = ["EVAL_SEED_BASE", "EvalReport", "evaluate"]

EVAL_SEED_BASE = 2_000_000_000
"""Held-out seeds start here: the training loop draws seeds `seed * 1_000_003 + group` far below it."""


@dataclass(frozen=True)
class EvalReport:
    """Greedy (or sampled) success of one policy version on one task."""

    task: str
    version: int
    episodes: int
    success_rate: float
    reward_mean: float
    temperature: float


async def evaluate(job: JobSpec, task: TaskSpec, job_id: str | None, version: int | None, episodes: int,
                   temperature: float = 0.0) -> EvalReport:  # fmt: skip
    """Play `episodes` held-out episodes of `task` with the job's policy `version` (None: latest; no job id: v0)."""
    engine = HfEngine.from_config(job.model_dir, job.engine)
    await engine.start()
    try:
        version = await _load_version(engine, job, job_id, version)
        sampling = task.sampling.model_copy(update={"temperature": temperature, "n": 1})
        env_entry, reward_entry = lookup_env(task.env), lookup_reward(task.reward)
        scorer = reward_entry.load(task.reward_args)
        results = []
        for i in range(episodes):
            transcript = await _play(engine, env_entry.cls(**task.env_args), task, sampling, EVAL_SEED_BASE + i)
            results.append(as_reward_result(await asyncio.to_thread(scorer, transcript), task.reward))
    finally:
        await engine.shutdown()
    return EvalReport(task=task.name, version=version, episodes=episodes, temperature=temperature,
                      success_rate=statistics.fmean(float(r.success) for r in results),
                      reward_mean=statistics.fmean(r.value for r in results))  # fmt: skip


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
        blob = store.get(weights_key(job_id, version))
    except StoreKeyError as e:
        raise ValueError(f"job {job_id!r} has no published v{version} in {store!r}: {e}") from e
    with tempfile.TemporaryDirectory(prefix="rollart-eval-") as tmp:
        path = Path(tmp) / "weights.safetensors"
        path.write_bytes(blob)
        await engine.load_weights(path, version)
    return version


async def _play(engine: HfEngine, env: object, task: TaskSpec, sampling: object, seed: int) -> Transcript:
    observation = env.reset(seed)  # type: ignore[attr-defined]
    turns: list[TurnRecord] = []
    for turn in range(task.max_turns):
        out = await engine.generate(observation, sampling, f"eval-{seed}-{turn}")  # type: ignore[arg-type]
        action = out.completions[0].text
        step = env.step(action)  # type: ignore[attr-defined]
        turns.append(TurnRecord(observation=observation, action=action, env_reward=step.reward, done=step.done,
                                info=step.info))  # fmt: skip
        observation = step.observation
        if step.done:
            break
    env.close()  # type: ignore[attr-defined]
    return Transcript(task=task.name, seed=seed, turns=turns, final_observation=observation)
