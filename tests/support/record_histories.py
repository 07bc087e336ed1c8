"""Record the replay fixtures of the group and training workflows: `python -m tests.support.record_histories`.

Runs a short mixed job (a multi-turn task with `rollout_unit: group` and a
single-turn task) on a dev server with the stand-in activities of
tests.support.standins, then writes the histories that test_replay replays
against today's workflow code. A fixture already there is kept: after an
intended, versioned change of a workflow's command sequence, the old fixture
stays (older histories must keep replaying) and the new path gets a new name
in `KINDS` or `TRAINING`.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from temporalio.client import Client, WorkflowExecution
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from rollart.contracts.activities import RewardResult, Transcript
from rollart.contracts.training import TrainingInput, TrainingResult
from rollart.infra.config import JobSpec, TrainingConfig, resolve
from rollart.infra.devserver import find_temporal_cli
from rollart.infra.search_attributes import ensure_registered
from tests.support.standins import StandIns, full_marks, standin_workers
from tests.support.tasks import frozenlake_task

HISTORIES = Path(__file__).resolve().parent.parent / "histories"
TRAINING = "training-continued-as-new"
FILTERING = "training-dynamic-sampling"
KINDS = {
    "group-multi-turn": "frozenlake",
    "group-single-turn-wave": "math",
    "group-multi-turn-close-while-scoring": "frozenlake",
    "group-multi-turn-ui-summary": "frozenlake",
    "group-single-turn-ui-summary": "math",
}
"""Fixture name → the task whose GroupRolloutWorkflow it records (`group-single-turn`: before the wave's
generate_batch; `group-multi-turn`: before the patch close-while-scoring; the others before the patch
ui-summary)."""
UI_SUMMARY = {
    "trajectory-ui-summary": ("TrajectoryWorkflow", "completed"),
    "trajectory-failed-ui-summary": ("TrajectoryWorkflow", "failed"),
    "batch-ui-summary": ("BatchRolloutWorkflow", "partial"),
}
"""Fixture name → the rollout workflow it records from `_record_ui_summary`'s jobs, found by its outcome's search
attributes (patch ui-summary); and `training-ui-summary`, the training workflow starting trajectories with a
static summary."""
TRAINING_UI_SUMMARY = "training-ui-summary"


async def _history_json(client: Client, workflow_id: str, run_id: str | None = None) -> str:
    return (await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()).to_json()


async def main() -> None:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=find_temporal_cli(), ui=False, data_converter=pydantic_data_converter
    )
    try:
        await ensure_registered(env.client)
        math = frozenlake_task(
            name="math",
            env="arithmetic",
            env_args={},
            reward="exact_match",
            generate_pool="h20",
            max_turns=1,
            group_size=4,
            weight=1.0,
        )
        lake = frozenlake_task(group_size=4, max_turns=3, rollout_unit="group", weight=1.0)
        spec = resolve(  # as a loaded job is: where its envs and rewards declare they run, filled in
            JobSpec(
                name="rec",
                tasks=[lake, math],
                training=TrainingConfig(steps=3, batch_size=8, async_bound=1, continue_as_new_every=2),
            )
        )
        job_id = f"rec-{uuid.uuid4().hex[:6]}"
        standins = StandIns(stagger=1, score=full_marks, train_delay_s=0.05, fail_seeds={1})
        async with standin_workers(env.client, standins):
            handle = await env.client.start_workflow(
                "TrainingWorkflow",
                TrainingInput(job=spec, job_id=job_id, run_dir="/tmp/unused"),
                id=job_id,
                task_queue="control",
                result_type=TrainingResult,
            )
            await handle.result()
        first_run = handle.first_execution_run_id
        HISTORIES.mkdir(exist_ok=True)
        if not (HISTORIES / f"{TRAINING}.json").exists():
            (HISTORIES / f"{TRAINING}.json").write_text(await _history_json(env.client, job_id, first_run))
        async for wf in env.client.list_workflows(
            f'WorkflowType="GroupRolloutWorkflow" AND RollartJobId="{job_id}" AND ExecutionStatus="Completed"'
        ):
            kind = next(
                (
                    k
                    for k, task in KINDS.items()
                    if wf.search_attributes.get("RollartTask") == [task] and not (HISTORIES / f"{k}.json").exists()
                ),
                None,
            )
            if kind:
                (HISTORIES / f"{kind}.json").write_text(await _history_json(env.client, wf.id, wf.run_id))
        if not (HISTORIES / f"{FILTERING}.json").exists():
            (HISTORIES / f"{FILTERING}.json").write_text(await _record_filtering(env.client))
        wanted = [name for name in [*UI_SUMMARY, TRAINING_UI_SUMMARY] if not (HISTORIES / f"{name}.json").exists()]
        if wanted:
            for name, text in (await _record_ui_summary(env.client)).items():
                if name in wanted:
                    (HISTORIES / f"{name}.json").write_text(text)
        print("wrote", sorted(p.name for p in HISTORIES.glob("*.json")))
    finally:
        await env.shutdown()


def _flat_every_other_seed(t: Transcript) -> RewardResult:
    """Members differ (1 and 2 turns), except in groups of even seeds, where every member scores 1."""
    return RewardResult(value=1.0 if t.seed % 2 == 0 else float(len(t.turns)), success=len(t.turns) == 2)


async def _record_filtering(client: Client) -> str:
    """A job with dynamic sampling on, whose flat groups are filtered and refilled: its whole history."""
    lake = frozenlake_task(group_size=2, max_turns=2, rollout_unit="group")
    spec = JobSpec(
        name="rec-ds",
        tasks=[lake],
        training=TrainingConfig(steps=3, batch_size=4, async_bound=1, dynamic_sampling=True),
    )
    job_id = f"rec-ds-{uuid.uuid4().hex[:6]}"
    async with standin_workers(client, StandIns(stagger=1, score=_flat_every_other_seed, train_delay_s=0.05)):
        handle = await client.start_workflow(
            "TrainingWorkflow",
            TrainingInput(job=spec, job_id=job_id, run_dir="/tmp/unused"),
            id=job_id,
            task_queue="control",
            result_type=TrainingResult,
        )
        result = await handle.result()
    assert result.filtered > 0, "the recorded job filtered no group"
    return await _history_json(client, job_id)


async def _record_ui_summary(client: Client) -> dict[str, str]:
    """A trajectory-mode job and a batch-mode one, every seed-1 env broken: the histories of the training workflow,
    of a completed and a failed TrajectoryWorkflow, and of a BatchRolloutWorkflow with some members failed."""
    lake = frozenlake_task(group_size=2, max_turns=3)
    found: dict[str, str] = {}
    for mode in ("trajectory", "batch"):
        spec = JobSpec(
            name="rec-ui",
            tasks=[lake],
            training=TrainingConfig(steps=2, batch_size=4, async_bound=1, rollout_mode=mode),
        )
        job_id = f"rec-ui-{mode}-{uuid.uuid4().hex[:6]}"
        async with standin_workers(client, StandIns(stagger=1, train_delay_s=0.05, fail_seeds={1})):
            handle = await client.start_workflow(
                "TrainingWorkflow",
                TrainingInput(job=spec, job_id=job_id, run_dir="/tmp/unused"),
                id=job_id,
                task_queue="control",
                result_type=TrainingResult,
            )
            await handle.result()
        if mode == "trajectory":
            found[TRAINING_UI_SUMMARY] = await _history_json(client, job_id)
        for name, (wf_type, status) in UI_SUMMARY.items():
            query = (
                f'WorkflowType="{wf_type}" AND RollartJobId="{job_id}" AND RollartStatus="{status}" '
                'AND ExecutionStatus="Completed"'
            )
            if wf := await _first(client, query):
                found[name] = await _history_json(client, wf.id, wf.run_id)
    return found


async def _first(client: Client, query: str, wait_s: float = 10.0) -> WorkflowExecution | None:
    """The first workflow the visibility query finds, waiting for visibility to catch up (it lags a little)."""
    for _ in range(int(wait_s / 0.5)):
        async for wf in client.list_workflows(query, limit=1):
            return wf
        await asyncio.sleep(0.5)
    return None


if __name__ == "__main__":
    asyncio.run(main())
