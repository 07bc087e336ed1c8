"""What the Temporal UI shows of rollout workflows: a static summary, outcome search attributes, current details.

Unit tests of the texts, then against a real dev server with stand-in activities: workflows started by
`rollart rollout`'s client and by a training job carry their one-line summary, end with their outcome in
search attributes that a visibility query filters on, and the histories they leave replay on this code.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowHandle, WorkflowHistory
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from rollart.client.rollout import plan_trajectories, run_rollout
from rollart.contracts.activities import RewardResult, Transcript
from rollart.contracts.rollouts import (
    BatchRolloutInput,
    GroupRolloutInput,
    GroupSeed,
    TrajectoryInput,
    TrajectoryResult,
)
from rollart.contracts.training import TrainingInput, TrainingResult
from rollart.infra.temporal import search_attributes as sa
from rollart.infra.temporal.worker_tuning import workflow_runner
from rollart.spec.config import JobSpec, TrainingConfig, WorkerTuning
from rollart.spec.pools import Pool, queue_name
from rollart.workflows import ALL_WORKFLOWS
from rollart.workflows.ui_summary import (
    SUMMARY_MAX_BYTES,
    Outcome,
    batch_summary,
    details,
    group_summary,
    one_line,
    trajectory_summary,
)
from tests.support.standins import StandIns, standin_workers
from tests.support.tasks import frozenlake_task, with_queue_prefix

HISTORIES = Path(__file__).parent / "histories"


def result(tid: str = "j-g000001-0", **fields: object) -> TrajectoryResult:
    base = {
        "trajectory_id": tid,
        "task": "frozenlake",
        "seed": 7,
        "status": "completed",
        "reward": 1.0,
        "success": True,
        "turns": 3,
        "policy_version_min": 4,
        "policy_version_max": 5,
    }
    return TrajectoryResult.model_validate({**base, **fields})


# ---------------------------------------------------------------- the texts (unit)


def test_start_summaries_name_task_seed_group_and_version() -> None:
    task = frozenlake_task(group_size=4)
    inp = TrajectoryInput(task=task, seed=17, job_id="job", group_id="job-g000012")
    assert trajectory_summary(inp, member=3, version=5) == "frozenlake · seed 17 · group g000012 member 3 · policy v5"
    assert trajectory_summary(TrajectoryInput(task=task, seed=17)) == "frozenlake · seed 17"
    one = GroupRolloutInput(task=task, job_id="job", groups=[GroupSeed(group_id="job-g000012", seed=17)])
    assert group_summary(one, version=2) == "frozenlake · seed 17 · group g000012 × 4 · policy v2"
    wave = GroupRolloutInput(
        task=task, job_id="job", lockstep=True, groups=[GroupSeed(group_id=f"job-g{g:06d}", seed=g) for g in (5, 6, 7)]
    )
    assert group_summary(wave) == "frozenlake · 3 groups × 4 · seeds 5…7 · lockstep"
    batch = BatchRolloutInput(trajectories=[inp, inp, inp.model_copy(update={"task": frozenlake_task(name="math")})])
    assert batch_summary(batch, version=0) == "lockstep batch · 3 episodes · frozenlake ×2, math ×1 · policy v0"


def test_one_line_keeps_to_200_bytes() -> None:
    text = one_line("ünïcödé " * 40, "tail")
    assert len(text.encode()) <= SUMMARY_MAX_BYTES and text.endswith("…") and "\n" not in text
    assert one_line("a\nb", None, "", "c") == "a b · c"


def test_outcome_of_a_trajectory_and_of_a_group() -> None:
    one = Outcome.of([result()])
    assert (one.status, one.reward, one.success, one.turns, one.versions, one.failure) == (
        "completed",
        1.0,
        True,
        3,
        "v4..v5",
        None,
    )
    failed = result(
        "j-g000001-2",
        status="failed",
        reward=None,
        success=None,
        turns=1,
        policy_version_max=6,
        error="step failed: EnvBroken: env 'x' step raised RuntimeError: boom\nTraceback ...",
    )
    group = Outcome.of([result(), result("j-g000001-1", reward=0.0, success=False, turns=6), failed])
    assert (group.status, group.reward, group.success, group.turns, group.versions) == (
        "partial",
        0.5,
        True,
        6,
        "v4..v6",
    )
    assert (group.successes, group.completed, group.members, group.failure) == (1, 2, 3, "step failed: EnvBroken")
    only_failed = Outcome.of([failed])
    assert only_failed.status == "failed" and only_failed.reward is None and only_failed.success is None
    names = {u.key.name for u in only_failed.attributes()}
    assert names == {"RollartStatus", "RollartTurns", "RollartVersions", "RollartFailure"}  # no reward: never scored


def test_details_are_markdown_with_a_row_per_member() -> None:
    assert details([result()]).startswith("**completed** · reward **1.000** · success: yes")
    failed = details([result(status="failed", reward=None, success=None, error="reset failed: timed out | x")])
    assert failed.startswith("**failed** (masked out of training, never scored): `reset failed: timed out \\| x`")
    members = [result(f"j-g1-{m}", success=m == 0, reward=float(m == 0)) for m in range(40)]
    text = details(members)
    assert text.startswith("**completed** · 1/40 succeeded · mean reward 0.025")
    assert "| j-g1-0 | completed | 1.000 | yes | 3 | v4..v5 |" in text and "… and 8 more" in text


def test_recorded_fixtures_hold_the_outcome_upsert() -> None:
    """The rollout fixtures, started with rollart's search attributes, upsert RollartStatus; the training ones start
    their children with a static summary."""
    for name in (
        "trajectory-completed",
        "trajectory-env-broken",
        "group-multi-turn",
        "group-single-turn",
        "group-lockstep",
        "batch",
    ):
        path = HISTORIES / f"{name}.json"
        history = WorkflowHistory.from_json(name, path.read_text())
        upserted = [
            e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
        ]
        assert any("RollartStatus" in fields for fields in upserted), name
    for name in ("training-trajectories", "training-batch"):
        training = WorkflowHistory.from_json(name, (HISTORIES / f"{name}.json").read_text())
        assert any(
            e.user_metadata.HasField("summary")
            for e in training.events
            if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
        ), name


# ---------------------------------------------------------------- against the dev server (orchestration)


async def listed(client: Client, query: str, count: int, wait_s: float = 15.0) -> list[str]:
    """Workflow ids the visibility query finds, once it finds `count` of them (visibility lags a little)."""
    ids: list[str] = []
    for _ in range(int(wait_s / 0.25)):
        ids = sorted([wf.id async for wf in client.list_workflows(query)])
        if len(ids) >= count:
            break
        await asyncio.sleep(0.25)
    return ids


async def current_details(handle: WorkflowHandle) -> str:
    """What the UI shows as the workflow's current details (a query: a worker must be up)."""
    meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return meta.current_details


async def assert_replays(client: Client, workflow_ids: list[str]) -> None:
    """The histories these workflows left replay on today's code, without a nondeterminism error."""
    replayer = Replayer(
        workflows=ALL_WORKFLOWS,
        data_converter=client.data_converter,
        workflow_runner=workflow_runner(WorkerTuning(sandbox="strict")),
    )
    for wid in workflow_ids:
        history = await client.get_workflow_handle(wid).fetch_history()
        replayed = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert replayed.replay_failure is None, (wid, replayed.replay_failure)


def _even_seeds_win(t: Transcript) -> RewardResult:
    return RewardResult(value=1.0 if t.seed % 2 == 0 else 0.25, success=t.seed % 2 == 0)


@pytest.mark.orchestration
async def test_rollout_trajectories_show_their_summary_and_outcome(
    bare_env: WorkflowEnvironment, queue_prefix: str
) -> None:
    client = bare_env.client
    job_id = f"ui-{uuid.uuid4().hex[:6]}"
    spec = with_queue_prefix(JobSpec(name="ui", tasks=[frozenlake_task(group_size=1, max_turns=3)]), queue_prefix)
    inputs = plan_trajectories(spec, 4, seed=0, job_id=job_id)  # seeds 0, 1, 2, 3
    w = StandIns(prefix=queue_prefix, turns=2, score=_even_seeds_win, fail_seeds={3})
    async with standin_workers(client, w):
        outcomes = await run_rollout(client, inputs, job_id)
        assert [o.status for o in outcomes] == ["completed", "completed", "completed", "failed"]
        ids = [o.workflow_id for o in outcomes]
        won = client.get_workflow_handle(ids[0])
        desc = await won.describe()
        assert await desc.static_summary() == "frozenlake · seed 0"
        attrs = desc.typed_search_attributes
        assert (attrs.get(sa.JOB_ID), attrs.get(sa.TASK), attrs.get(sa.STATUS)) == (job_id, "frozenlake", "completed")
        assert (attrs.get(sa.REWARD), attrs.get(sa.SUCCESS), attrs.get(sa.TURNS), attrs.get(sa.VERSIONS)) == (
            1.0,
            True,
            2,
            "v0..v0",
        )
        assert attrs.get(sa.FAILURE) is None
        assert (await current_details(won)).startswith("**completed** · reward **1.000** · success: yes")
        lost = (await client.get_workflow_handle(ids[3]).describe()).typed_search_attributes
        assert (lost.get(sa.STATUS), lost.get(sa.FAILURE), lost.get(sa.REWARD)) == (
            "failed",
            "step failed: EnvBroken",
            None,
        )
        assert (await current_details(client.get_workflow_handle(ids[3]))).startswith("**failed** (masked")
    mine = f"RollartJobId = '{job_id}'"
    assert await listed(client, f"{mine} AND RollartSuccess = false", 1) == [ids[1]]
    assert await listed(client, f"{mine} AND RollartTask = 'frozenlake' AND RollartReward >= 1", 2) == [ids[0], ids[2]]
    assert await listed(client, f"{mine} AND RollartStatus = 'failed'", 1) == [ids[3]]
    await assert_replays(client, ids)


def _first_turn_wins(t: Transcript) -> RewardResult:
    return RewardResult(value=float(len(t.turns) == 1), success=len(t.turns) == 1)


@pytest.mark.orchestration
async def test_training_children_show_their_summary_and_outcome(
    bare_env: WorkflowEnvironment, queue_prefix: str
) -> None:
    """Trajectory children and grouped ones: a group shows its mean reward, any success, its longest episode."""
    client = bare_env.client
    await sa.ensure_registered(client)
    tasks = [
        frozenlake_task(group_size=2, max_turns=2),
        frozenlake_task(name="lakegroup", group_size=2, max_turns=2, rollout_unit="group"),
    ]
    spec = with_queue_prefix(
        JobSpec(name="ui", tasks=tasks, training=TrainingConfig(steps=2, batch_size=4)), queue_prefix
    )
    job_id = f"uit-{uuid.uuid4().hex[:6]}"
    # member i of a group session plays i + 1 turns: in a group, member 0 wins and member 1 loses; alone, all win
    w = StandIns(prefix=queue_prefix, turns=1, stagger=1, score=_first_turn_wins, train_delay_s=0.05)
    async with standin_workers(client, w):
        handle = await client.start_workflow(
            "TrainingWorkflow",
            TrainingInput(job=spec, job_id=job_id, run_dir="/tmp/unused"),
            id=job_id,
            task_queue=queue_name(Pool.CONTROL, queue_prefix),
            result_type=TrainingResult,
        )
        await asyncio.wait_for(handle.result(), 60)
        mine = f"RollartJobId = '{job_id}' AND RollartStatus = 'completed'"
        trajectories = await listed(client, f"{mine} AND WorkflowType = 'TrajectoryWorkflow'", 1)
        groups = await listed(client, f"{mine} AND WorkflowType = 'GroupRolloutWorkflow'", 1)
        assert trajectories and groups
        child = client.get_workflow_handle(trajectories[0])
        desc = await child.describe()
        assert re.fullmatch(
            r"frozenlake · seed \d+ · group g\d{6} member [01] · policy v\d+", await desc.static_summary()
        )
        attrs = desc.typed_search_attributes
        assert (attrs.get(sa.TASK), attrs.get(sa.REWARD), attrs.get(sa.SUCCESS), attrs.get(sa.TURNS)) == (
            "frozenlake",
            1.0,
            True,
            1,
        )
        group = client.get_workflow_handle(groups[0])
        desc = await group.describe()
        assert re.fullmatch(
            r"lakegroup · (seed \d+ · group g\d{6} × 2|\d+ groups × 2 · seeds \d+…\d+) · policy v\d+",
            await desc.static_summary(),
        )
        attrs = desc.typed_search_attributes
        assert (attrs.get(sa.REWARD), attrs.get(sa.SUCCESS), attrs.get(sa.TURNS), attrs.get(sa.STATUS)) == (
            0.5,
            True,
            2,
            "completed",
        )
        text = await current_details(group)
        counted = re.match(r"\*\*completed\*\* · (\d+)/(\d+) succeeded · mean reward 0\.500 · longest 2 turn", text)
        assert counted and 2 * int(counted[1]) == int(counted[2]), text
        assert "| completed | 1.000 | yes | 1 |" in text and "| completed | 0.000 | no | 2 |" in text
    await assert_replays(client, [job_id, trajectories[0], groups[0]])


@pytest.mark.orchestration
async def test_a_trajectory_started_without_rollart_attributes_upserts_none(
    bare_env: WorkflowEnvironment, queue_prefix: str
) -> None:
    """As `temporal workflow start` with no `--search-attribute`: its namespace may lack them, so it adds none
    (an unregistered one would fail its last workflow task forever), and its details are shown all the same."""
    client = bare_env.client
    inp = TrajectoryInput(task=frozenlake_task(max_turns=3), seed=1, queue_prefix=queue_prefix)
    async with standin_workers(client, StandIns(prefix=queue_prefix, turns=2)):
        handle = await client.start_workflow(
            "TrajectoryWorkflow",
            inp,
            id=f"plain-{uuid.uuid4().hex[:6]}",
            task_queue=queue_name(Pool.CONTROL, queue_prefix),
            result_type=TrajectoryResult,
        )
        assert (await handle.result()).status == "completed"
        assert (await current_details(handle)).startswith("**completed**")
    desc = await handle.describe()
    assert await desc.static_summary() is None
    assert desc.typed_search_attributes.get(sa.STATUS) is None
    history = await handle.fetch_history()
    upserted = [
        e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
    ]
    assert not any(name.startswith("Rollart") for fields in upserted for name in fields)  # only the SDK's own
    await assert_replays(client, [handle.id])
