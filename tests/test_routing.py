"""One routing decision (spec/routing.py) and one module of ids and seeds (contracts/ids.py): the unit each
kind of task plays in, for training and `rollart rollout` alike, and the values every id and seed keeps."""

from __future__ import annotations

import uuid

import pytest
from temporalio.testing import WorkflowEnvironment

from rollart.client.rollout import plan_trajectories, rollout_units, run_rollout, unit_input
from rollart.contracts import ids
from rollart.contracts.rollouts import GroupRolloutInput, TrajectoryInput, TrajectoryResult
from rollart.spec.config import JobSpec, TrainingConfig
from rollart.spec.routing import Unit, unit_of
from tests.support.standins import StandIns, full_marks, standin_workers
from tests.support.tasks import frozenlake_task, with_queue_prefix
from tests.support.training_plans import arithmetic_task

EPISODES = frozenlake_task(group_size=2)
GROUPS = frozenlake_task(name="lakeg", group_size=2, rollout_unit="group")
SINGLE_TURN = arithmetic_task(group_size=4)


@pytest.mark.parametrize(
    ("task", "trajectory", "batch"),
    [
        (EPISODES, Unit.TRAJECTORY, Unit.LOCKSTEP_BATCH),
        (GROUPS, Unit.GROUP, Unit.GROUP),
        (SINGLE_TURN, Unit.SINGLE_TURN_WAVE, Unit.SINGLE_TURN_WAVE),
        (arithmetic_task(rollout_unit="group"), Unit.SINGLE_TURN_WAVE, Unit.SINGLE_TURN_WAVE),
    ],
    ids=["episodes", "groups", "single-turn", "single-turn-group"],
)
def test_each_task_plays_in_one_unit_per_mode(task, trajectory: Unit, batch: Unit) -> None:  # type: ignore[no-untyped-def]
    assert unit_of(task, "trajectory") is trajectory and unit_of(task, "batch") is batch
    assert unit_of(task) is trajectory  # `rollart rollout` and `rollart eval` play as trajectory mode does


def test_each_unit_names_the_workflow_that_plays_it() -> None:
    assert {u: (u.workflow, u.grouped) for u in Unit} == {
        Unit.TRAJECTORY: ("TrajectoryWorkflow", False),
        Unit.GROUP: ("GroupRolloutWorkflow", True),
        Unit.SINGLE_TURN_WAVE: ("GroupRolloutWorkflow", True),
        Unit.LOCKSTEP_BATCH: ("BatchRolloutWorkflow", False),
    }


def test_rollout_plays_a_single_turn_group_as_one_wave_as_training_does() -> None:
    """`rollart rollout` of a single-turn task: a GroupRolloutWorkflow per group (its members share it), not one
    TrajectoryWorkflow per episode; the last group may be cut short. Per-episode tasks stay one workflow each."""
    job = JobSpec(
        tasks=[SINGLE_TURN, EPISODES.model_copy(update={"weight": 0.5})], training=TrainingConfig(batch_size=4)
    )
    inputs = plan_trajectories(job, 30, seed=3, job_id="j")
    units = rollout_units(inputs)
    assert [i for first, members in units for i in range(first, first + len(members))] == list(range(30))
    for first, members in units:
        unit, workflow_id, inp = unit_input(first, members, "j")
        assert workflow_id == f"j-{members[0].task.name}-{first:04d}"
        if members[0].task.name == "math":
            assert unit is Unit.SINGLE_TURN_WAVE and isinstance(inp, GroupRolloutInput)
            assert len({m.seed for m in members}) == 1 and inp.task.group_size == len(members) <= 4
            assert [g.group_id for g in inp.groups] == [workflow_id] and inp.groups[0].seed == members[0].seed
        else:
            assert unit is Unit.TRAJECTORY and inp == members[0] and len(members) == 1
    assert any(len(m) == 4 for _, m in units if m[0].task.name == "math")


def test_ids_keep_their_values() -> None:
    """Workflow ids, store keys and env seeds of running and finished jobs: none may change."""
    assert ids.group_id("job", 12) == "job-g000012"
    assert ids.member_id("job-g000012", 3) == "job-g000012-3"
    assert (
        ids.batch_id("job-g000012") == "job-g000012-b"
        and ids.batch_member_id("job-g000012-b", 7) == "job-g000012-b-007"
    )
    assert ids.wave_id("job-g000012") == "job-g000012-w"
    assert ids.unit_id("job", "math", 16) == "job-math-0016"


def test_seeds_keep_their_values() -> None:
    assert ids.SEED_STRIDE == 1_000_003
    assert [ids.derive_seed(0, g) for g in range(3)] == [0, 1, 2]
    assert ids.derive_seed(7, 3) == 7_000_024
    assert ids.EVAL_SEED_BASE == 2_000_000_000 > ids.derive_seed(1_000, 1_000_000)  # held-out: above training's
    job = JobSpec(tasks=[EPISODES], training=TrainingConfig(batch_size=4))
    assert [(i.task.name, i.seed) for i in plan_trajectories(job, 4, seed=5)] == [("frozenlake", 5000015)] * 2 + [
        ("frozenlake", 5000016)
    ] * 2


def test_a_trajectory_input_of_a_rollout_is_its_own_unit() -> None:
    [(first, members)] = rollout_units([TrajectoryInput(task=EPISODES, seed=1)])
    assert unit_input(first, members, "j")[:2] == (Unit.TRAJECTORY, "j-frozenlake-0000")


@pytest.mark.orchestration
async def test_a_rollout_of_a_single_turn_task_plays_waves_and_reports_every_member(
    bare_env: WorkflowEnvironment, queue_prefix: str
) -> None:
    """Through the server: each group one GroupRolloutWorkflow of four calls (no env session), an outcome per
    trajectory in plan order, its members sharing their group's workflow id (the table's link)."""
    job_id = f"st-{uuid.uuid4().hex[:6]}"
    spec = with_queue_prefix(
        JobSpec(name="st", tasks=[SINGLE_TURN], training=TrainingConfig(batch_size=4)), queue_prefix
    )
    inputs = plan_trajectories(spec, 6, seed=0, job_id=job_id)  # groups of 4: one whole, one cut short to 2
    w = StandIns(prefix=queue_prefix, score=full_marks)
    async with standin_workers(bare_env.client, w):
        outcomes = await run_rollout(bare_env.client, inputs, job_id)
    assert [o.inp for o in outcomes] == inputs and all(o.status == "completed" for o in outcomes)
    assert [o.workflow_id for o in outcomes] == [f"{job_id}-math-0000"] * 4 + [f"{job_id}-math-0004"] * 2
    assert [o.result.trajectory_id for o in outcomes if o.result] == [f"{job_id}-math-0000-{m}" for m in range(4)] + [
        f"{job_id}-math-0004-{m}" for m in range(2)
    ]
    assert {c.name for c in w.calls} == {"prompts", "generate_batch", "check", "reward_batch"}
    assert sorted(inp.sampling.n for inp in w.inputs("generate_batch")) == [2, 4]


def test_the_rollout_summary_counts_each_units_activities(capsys: pytest.CaptureFixture[str]) -> None:
    """A single-turn group is one wave of four calls for all its members; an episode of t turns 2t + 3 calls."""
    from rollart.cli.rollout import _print_summary
    from rollart.client.rollout import RolloutOutcome

    def outcome(wid: str, inp: TrajectoryInput, turns: int) -> RolloutOutcome:
        r = TrajectoryResult(trajectory_id=wid, task=inp.task.name, seed=0, status="completed", reward=1.0, turns=turns)
        return RolloutOutcome(wid, "run", inp, r, None, 1.0)

    wave, episode = TrajectoryInput(task=SINGLE_TURN, seed=0), TrajectoryInput(task=EPISODES, seed=0)
    _print_summary([*(outcome("w", wave, 1) for _ in range(4)), outcome("e", episode, 3)], wall=1.0)
    assert "5/5 completed in 1.0s · 5.00 trajectories/s · 13.0 activities/s" in capsys.readouterr().out  # 4 + 9
