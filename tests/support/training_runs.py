"""One short training job on a running stack, followed to the end: what the training tests assert on."""

from __future__ import annotations

import uuid
from pathlib import Path

from temporalio.client import Client

from rollart.client.train import MetricsWriter, follow, start_training
from rollart.contracts.training import TrainingResult, TrainingStatus
from rollart.spec.config import JobSpec, TrainerConfig, TrainingConfig
from tests.support.tasks import frozenlake_task

__all__ = ["run_job"]


async def run_job(
    client: Client,
    base: JobSpec,
    tmp_path: Path,
    unit: str = "trajectory",
    trainer: TrainerConfig | None = None,
    task: dict | None = None,
    **training: object,
) -> tuple[JobSpec, TrainingResult, TrainingStatus, list[dict]]:
    """FrozenLake (groups of 4, ≤ 4 turns), 3 steps of 8 unless `training` says otherwise; the job, its result,
    final status and the metrics rows. `task` overrides fields of the FrozenLake task (`reward`, say)."""
    job = base.model_copy(
        update={
            "tasks": [
                frozenlake_task(
                    **{
                        "group_size": 4,
                        "max_turns": 4,
                        "env_args": {"maps": "standard"},
                        "rollout_unit": unit,
                        **(task or {}),
                    }
                )
            ],
            "training": TrainingConfig(**{"steps": 3, "batch_size": 8, **training}),
            "trainer": trainer or base.trainer,
        }
    )
    job_id = f"e2e-{uuid.uuid4().hex[:8]}"
    handle = await start_training(client, job, job_id, tmp_path / job_id)
    rows: list[dict] = []
    result = await follow(handle, MetricsWriter(tmp_path / job_id), rows.append, poll_s=0.2)
    status = await handle.query("status", result_type=TrainingStatus)
    return job.model_copy(update={"name": job_id}), result, status, rows
