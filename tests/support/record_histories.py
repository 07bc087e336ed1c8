"""Record every replay fixture from today's code: `python -m tests.support.record_histories`.

`python -m tests.support.record_histories NAME ...` records only those (a new path's fixture, the others kept).
Starts a Temporal dev server with the stand-in activities of tests.support.standins, plays a few short jobs
and single rollouts on it, and writes the history of one workflow of each path worth pinning (`FIXTURES`)
to tests/histories/, overwriting the fixture of that name; tests/test_replay.py replays them on today's code.

The policy (docs/development.md, "Versioning workflows"):
- Before a release, nothing is patched: re-record every fixture with this command and commit them.
- From 0.1.0 on, a change to the command sequence of a released workflow goes behind `workflow.patched(id)`
  (listed in workflows/patches.py), and the histories of the release before keep replaying: first copy each
  fixture the change concerns to `<name>-<release>.json` (kept until the patch's call is removed), then
  re-record. A fixture under a name outside `FIXTURES` is never touched here.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from temporalio.client import Client, WorkflowExecution, WorkflowFailureError
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from rollart.contracts.activities import RewardResult, Transcript
from rollart.contracts.rollouts import TrajectoryInput, TrajectoryResult
from rollart.contracts.training import TrainingInput, TrainingResult
from rollart.infra.local.devserver import find_temporal_cli
from rollart.infra.temporal import search_attributes as sa
from rollart.spec.config import JobSpec, TrainingConfig, resolve
from rollart.workflows.ui_summary import trajectory_summary
from tests.support.standins import StandIns, full_marks, standin_workers
from tests.support.tasks import frozenlake_task

__all__ = ["FIXTURES", "HISTORIES", "main"]

HISTORIES = Path(__file__).resolve().parent.parent / "histories"
FIXTURES = {
    "trajectory-completed": "a training job's TrajectoryWorkflow child: 3 turns (the later ones on the first's "
    "engine), scored, outcome upserted",
    "trajectory-env-broken": "a TrajectoryWorkflow child whose step raises EnvBroken: failed, closed, never scored",
    "trajectory-unknown-env": "a TrajectoryWorkflow whose reset raises UnknownComponent: the workflow fails",
    "trajectory-invalid-input": "a TrajectoryWorkflow started with input that does not validate: it fails at once",
    "trajectory-agent": "a TrajectoryWorkflow of an agent program (`env: agent`): run_agent, its two chat requests as "
    "updates (the second continuing the first), its own reward",
    "group-multi-turn": "a GroupRolloutWorkflow of a `rollout_unit: group` task: each group plays on its own, "
    "its later turns on its first turn's engine",
    "group-single-turn": "a GroupRolloutWorkflow wave of single-turn groups: prompts, live_engines, generate_batch, "
    "check, reward",
    "group-lockstep": "a batch-mode job's GroupRolloutWorkflow: its groups play phase by phase together",
    "group-free-members": "a GroupRolloutWorkflow of a `group_play: free` task: each member plays on its own "
    "(reset, turns, reward, close), one member's turn refused (failed), the group reported once",
    "batch": "a batch-mode job's BatchRolloutWorkflow, some episodes failed: each finishes on its own",
    "training-continued-as-new": "a mixed job's TrainingWorkflow (groups, waves), its first run up to continue-as-new",
    "training-trajectories": "a trajectory-mode job's TrainingWorkflow: TrajectoryWorkflow children, some failed",
    "training-batch": "a batch-mode job's TrainingWorkflow: lockstep batches and lockstep groups",
    "training-dynamic-sampling": "a TrainingWorkflow with dynamic sampling, whose flat groups are filtered, refilled",
    "training-auto-placement": "a TrainingWorkflow of `generate_pool: auto` tasks under `engine.priority: predicted`: "
    "spread, re-planned onto the faster pool (its memo upserted), children launched with predicted lengths",
}
"""Fixture name → the workflow path its history pins."""


async def main(only: list[str] | None = None) -> None:
    """Record every fixture, or (`only`) those named: a new path's fixture, leaving the others as recorded."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=find_temporal_cli(), ui=False, data_converter=pydantic_data_converter
    )
    try:
        client = env.client
        await sa.ensure_registered(client)
        found: dict[str, str] = {}
        for recorder in RECORDERS:
            if only is None or set(only) & set(RECORDERS[recorder]):
                found |= await recorder(client)
    finally:
        await env.shutdown()
    wanted = sorted(only or FIXTURES)
    missing = sorted(set(wanted) - set(found))
    if missing:
        raise SystemExit(f"no workflow of the recorded jobs took these paths: {missing}; nothing written")
    HISTORIES.mkdir(exist_ok=True)
    for name in wanted:
        (HISTORIES / f"{name}.json").write_text(found[name])
    print("wrote", [f"{name}.json" for name in wanted], "to", HISTORIES)


async def _history_json(client: Client, workflow_id: str, run_id: str | None = None) -> str:
    return (await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()).to_json()


async def _train(client: Client, spec: JobSpec, job_id: str, standins: StandIns) -> tuple[TrainingResult, str]:
    """Run the job to its end on stand-in workers: its result, and the id of its first run."""
    async with standin_workers(client, standins):
        handle = await client.start_workflow(
            "TrainingWorkflow",
            TrainingInput(job=spec, job_id=job_id, run_dir="/tmp/unused"),
            id=job_id,
            task_queue="control",
            result_type=TrainingResult,
        )
        return await handle.result(), handle.first_execution_run_id or ""


async def _first(client: Client, query: str, wait_s: float = 10.0) -> WorkflowExecution | None:
    """The first workflow the visibility query finds, waiting for visibility to catch up (it lags a little)."""
    for _ in range(int(wait_s / 0.5)):
        async for wf in client.list_workflows(query, limit=1):
            return wf
        await asyncio.sleep(0.5)
    return None


async def _children(client: Client, job_id: str, wanted: dict[str, str]) -> dict[str, str]:
    """Fixture name → the history of the job's first completed workflow that the query condition finds."""
    found = {}
    for name, condition in wanted.items():
        query = f'RollartJobId="{job_id}" AND ExecutionStatus="Completed" AND {condition}'
        if wf := await _first(client, query):
            found[name] = await _history_json(client, wf.id, wf.run_id)
    return found


async def _record_mixed_job(client: Client) -> dict[str, str]:
    """A multi-turn task with `rollout_unit: group` and a single-turn one: the training workflow's first run
    (up to its continue-as-new), a group of the first task and a wave of the second."""
    math = frozenlake_task(
        name="math",
        env="arithmetic",
        env_args={},
        reward="exact_match",
        generate_pool="h20",
        max_turns=1,
        group_size=4,
    )
    lake = frozenlake_task(group_size=4, max_turns=3, rollout_unit="group")
    spec = JobSpec(
        name="rec",
        tasks=[lake, math],
        training=TrainingConfig(steps=3, batch_size=8, async_bound=1, continue_as_new_every=2),
    )
    spec = resolve(spec)  # as a loaded job is: its envs' and rewards' placement filled in
    job_id = f"rec-{uuid.uuid4().hex[:6]}"
    _, first_run_id = await _train(
        client, spec, job_id, StandIns(stagger=1, score=full_marks, train_delay_s=0.05, fail_seeds={1}, engines=("e1",))
    )
    found = {"training-continued-as-new": await _history_json(client, job_id, first_run_id)}
    group = 'WorkflowType="GroupRolloutWorkflow" AND RollartTask='
    return found | await _children(
        client, job_id, {"group-multi-turn": f'{group}"frozenlake"', "group-single-turn": f'{group}"math"'}
    )


async def _record_free_members(client: Client) -> dict[str, str]:
    """A `group_play: free` group of 3 members, the second refused at its second turn; later turns on one engine."""
    lake = frozenlake_task(name="lakefree", group_size=3, max_turns=3, rollout_unit="group", group_play="free")
    spec = resolve(JobSpec(name="rec-free", tasks=[lake], training=TrainingConfig(steps=1, batch_size=3)))
    job_id = f"rec-free-{uuid.uuid4().hex[:6]}"
    standins = StandIns(turns=3, train_delay_s=0.05, rejected_key="-1/turn-001", engines=("e1",))
    await _train(client, spec, job_id, standins)
    found = await _children(client, job_id, {"group": 'WorkflowType="GroupRolloutWorkflow"'})
    return {"group-free-members": found["group"]}


async def _record_trajectory_job(client: Client) -> dict[str, str]:
    """A trajectory-mode job whose seed-1 env breaks: the training workflow, a completed and a failed child."""
    spec = JobSpec(
        name="rec-traj",
        tasks=[frozenlake_task(group_size=2, max_turns=3)],
        training=TrainingConfig(steps=2, batch_size=4, async_bound=1),
    )
    spec = resolve(spec)  # as a loaded job is: its envs' and rewards' placement filled in
    job_id = f"rec-traj-{uuid.uuid4().hex[:6]}"
    # one named engine: later turns go to its private queue (session affinity), as they do on real workers
    await _train(client, spec, job_id, StandIns(turns=3, train_delay_s=0.05, fail_seeds={1}, engines=("e1",)))
    trajectory = 'WorkflowType="TrajectoryWorkflow" AND RollartStatus='
    return {"training-trajectories": await _history_json(client, job_id)} | await _children(
        client,
        job_id,
        {"trajectory-completed": f'{trajectory}"completed"', "trajectory-env-broken": f'{trajectory}"failed"'},
    )


async def _record_batch_job(client: Client) -> dict[str, str]:
    """A batch-mode job of a per-episode task and a grouped one, seed 4's env broken: the training workflow, a
    lockstep batch with some episodes failed (groups 4 and 5 draw the first task), and a lockstep
    GroupRolloutWorkflow."""
    tasks = [
        frozenlake_task(group_size=2, max_turns=3, weight=3.0),
        frozenlake_task(name="lakegroup", group_size=2, max_turns=3, rollout_unit="group"),
    ]
    spec = JobSpec(
        name="rec-batch",
        tasks=tasks,
        training=TrainingConfig(steps=3, batch_size=4, async_bound=1, rollout_mode="batch"),
    )
    spec = resolve(spec)  # as a loaded job is: its envs' and rewards' placement filled in
    job_id = f"rec-batch-{uuid.uuid4().hex[:6]}"
    await _train(client, spec, job_id, StandIns(turns=1, stagger=1, train_delay_s=0.05, fail_seeds={4}))
    return {"training-batch": await _history_json(client, job_id)} | await _children(
        client,
        job_id,
        {
            "batch": 'WorkflowType="BatchRolloutWorkflow" AND RollartStatus="partial"',
            "group-lockstep": 'WorkflowType="GroupRolloutWorkflow"',
        },
    )


def _flat_every_other_seed(t: Transcript) -> RewardResult:
    """Members differ (1 and 2 turns), except in groups of even seeds, where every member scores 1."""
    return RewardResult(value=1.0 if t.seed % 2 == 0 else float(len(t.turns)), success=len(t.turns) == 2)


async def _record_filtering(client: Client) -> dict[str, str]:
    """A job with dynamic sampling on, whose flat groups are filtered and refilled: its whole history."""
    spec = JobSpec(
        name="rec-ds",
        tasks=[frozenlake_task(group_size=2, max_turns=2, rollout_unit="group")],
        training=TrainingConfig(steps=3, batch_size=4, async_bound=1, dynamic_sampling=True),
    )
    spec = resolve(spec)  # as a loaded job is: its envs' and rewards' placement filled in
    job_id = f"rec-ds-{uuid.uuid4().hex[:6]}"
    result, _ = await _train(
        client, spec, job_id, StandIns(stagger=1, score=_flat_every_other_seed, train_delay_s=0.05)
    )
    assert result.filtered > 0, "the recorded job filtered no group"
    return {"training-dynamic-sampling": await _history_json(client, job_id)}


async def _record_agent(client: Client) -> dict[str, str]:
    """An agent program's trajectory (a stand-in program making two chat requests), started as `rollart rollout`
    starts one."""
    task = frozenlake_task(name="agent", env="agent", env_args={"entry": "m:run"}, max_turns=3)
    inp = TrajectoryInput(task=task, seed=2, job_id="rec-agent")
    wid = f"rec-agent-{uuid.uuid4().hex[:6]}"
    async with standin_workers(client, StandIns(agent_turns=2)):
        await client.execute_workflow(
            "TrajectoryWorkflow", inp, id=wid, task_queue="control", result_type=TrajectoryResult
        )
    return {"trajectory-agent": await _history_json(client, wid)}


async def _record_failed_starts(client: Client) -> dict[str, str]:
    """Trajectories that fail the workflow, started as `rollart rollout` starts one: an env nobody registered, and
    raw JSON that does not validate (what `temporal workflow start` may send)."""
    found = {}
    unknown = TrajectoryInput(task=frozenlake_task(env="nope"), seed=1, job_id="rec-env")
    attributes = TypedSearchAttributes(
        [SearchAttributePair(sa.JOB_ID, "rec-env"), SearchAttributePair(sa.TASK, unknown.task.name)]
    )
    invalid = {"task": {"name": "t", "env": "frozenlake", "max_turns": 0}, "seed": 1}
    async with standin_workers(client, StandIns(unknown_env=True)):
        for name, inp in (("trajectory-unknown-env", unknown), ("trajectory-invalid-input", invalid)):
            wid = f"rec-{name}-{uuid.uuid4().hex[:6]}"
            handle = await client.start_workflow(
                "TrajectoryWorkflow",
                inp,
                id=wid,
                task_queue="control",
                result_type=TrajectoryResult,
                search_attributes=attributes if inp is unknown else None,
                static_summary=trajectory_summary(unknown) if inp is unknown else None,
            )
            try:
                await handle.result()
            except WorkflowFailureError:
                found[name] = await _history_json(client, wid)
    return found


async def _record_auto_placement(client: Client) -> dict[str, str]:
    """Two auto tasks on pools whose stand-in engines report h800 100x faster, predicted priority: the whole
    history of a job whose placement moves after step 2."""
    tasks = [frozenlake_task(name=n, generate_pool="auto", group_size=2, max_turns=2) for n in ("a", "b")]
    spec = JobSpec(
        name="rec-auto",
        tasks=tasks,
        training=TrainingConfig(steps=4, batch_size=4, async_bound=1, placement={"every_steps": 2}),
        engine={"priority": "predicted"},
    )
    spec = resolve(spec)  # as a loaded job is: its envs' and rewards' placement filled in
    job_id = f"rec-auto-{uuid.uuid4().hex[:6]}"
    standins = StandIns(turns=1, stagger=1, train_delay_s=0.05, pool_rates={"h800": 10_000.0, "h20": 100.0})
    await _train(client, spec, job_id, standins)
    return {"training-auto-placement": await _history_json(client, job_id)}


RECORDERS: dict[Callable[[Client], Awaitable[dict[str, str]]], tuple[str, ...]] = {
    _record_mixed_job: ("training-continued-as-new", "group-multi-turn", "group-single-turn"),
    _record_trajectory_job: ("training-trajectories", "trajectory-completed", "trajectory-env-broken"),
    _record_batch_job: ("training-batch", "batch", "group-lockstep"),
    _record_filtering: ("training-dynamic-sampling",),
    _record_failed_starts: ("trajectory-unknown-env", "trajectory-invalid-input"),
    _record_agent: ("trajectory-agent",),
    _record_free_members: ("group-free-members",),
    _record_auto_placement: ("training-auto-placement",),
}


if __name__ == "__main__":
    import sys

    asyncio.run(main(sys.argv[1:] or None))
