"""Admission as plain code (workflows/training/admission.py): capacity, the task draw, what one launch starts."""

from __future__ import annotations

from collections import Counter

from rollart.contracts.ids import derive_seed
from rollart.contracts.rollouts import BatchRolloutInput, GroupRolloutInput, TrajectoryInput
from rollart.contracts.training import InFlight, TrainingState
from rollart.spec.routing import Unit
from rollart.workflows.training import admission
from tests.support.tasks import frozenlake_task
from tests.support.training_plans import arithmetic_task, plan, sample


def test_capacity_is_bound_plus_one_batches_in_flight_and_buffered() -> None:
    p = plan(async_bound=1, batch_size=8)  # groups of 4: capacity (1 + 1) x 8 = 16
    state = TrainingState(
        in_flight={f"t{i}": InFlight(group="g", workflow="w") for i in range(8)},
        buffer=[sample(f"b{i}", "h") for i in range(4)],
    )
    assert admission.capacity(p) == 16 and admission.can_launch(p, state)  # 12 + 4 ≤ 16
    state.buffer.append(sample("b4", "h"))
    assert not admission.can_launch(p, state)  # 13 + 4 > 16
    assert admission.capacity(plan(async_bound=0)) == 8
    assert admission.capacity(plan(async_bound=0, dynamic_sampling=True)) == 10  # + 25 % oversample
    assert not admission.can_launch(p, TrainingState(paused=True))
    assert not admission.can_launch(p, TrainingState(stop_requested=True))


def test_batch_mode_launches_a_whole_batch_at_a_time() -> None:
    p = plan(async_bound=0, batch_size=8, rollout_mode="batch")
    assert admission.next_launch_size(p, TrainingState()) == 8
    state = TrainingState(buffer=[sample("x", "h")])
    assert not admission.can_launch(p, state)  # 1 + 8 > 8


def test_group_g_draws_its_task_by_weight_from_the_seed_alone() -> None:
    """The values of today's runs: changing the draw would change every job's tasks and seeds."""
    a, b = frozenlake_task(name="a", group_size=2, weight=1.0), frozenlake_task(name="b", group_size=2, weight=3.0)
    draws = {seed: "".join(admission.next_task(plan(a, b, seed=seed), g).name for g in range(12)) for seed in (0, 7)}
    assert draws == {0: "babaabbbabbb", 7: "babbbaabbbbb"}
    shares = Counter(admission.next_task(plan(a, b), g).name for g in range(2000))
    assert 0.7 < shares["b"] / 2000 < 0.8  # weight 3 : 1


def test_a_drawn_group_has_its_id_and_seed_and_counts_as_unfinished() -> None:
    p, state = plan(seed=7), TrainingState()
    groups = [admission.draw_group(p, state, "j") for _ in range(3)]
    assert [(g.group_id, g.seed) for g in groups] == [
        ("j-g000000", 7000021),
        ("j-g000001", 7000022),
        ("j-g000002", 7000023),
    ]
    assert state.next_group == 3 and state.unfinished == {g.group_id: 4 for g in groups}
    assert groups[1].seed == derive_seed(7, 1)


def test_trajectory_mode_starts_a_trajectory_per_member_up_to_the_capacity() -> None:
    p, state = plan(frozenlake_task(group_size=2), async_bound=1, batch_size=4), TrainingState()
    launches = admission.launches(p, state, "j")
    assert [(x.unit, x.workflow_id, x.member) for x in launches] == [
        (Unit.TRAJECTORY, f"j-g00000{g}-{m}", m) for g in range(4) for m in range(2)
    ]
    assert state.started == 8 == len(state.in_flight) == admission.capacity(p)
    assert state.in_flight["j-g000003-1"] == InFlight(group="j-g000003", workflow="j-g000003-1")
    assert admission.launches(p, state, "j") == [] and state.started == 8  # full: nothing more


def test_a_large_window_is_launched_in_rounds_between_which_a_run_may_continue() -> None:
    """`most` stops the drawing at a round's worth of trajectories (whole groups); the next call draws on from
    there, until the window is full."""
    p, state = plan(frozenlake_task(group_size=8), async_bound=1, batch_size=512), TrainingState()
    rounds = []
    while launched := admission.launches(p, state, "j", most=admission.LAUNCH_ROUND):
        rounds.append(len(launched))
    assert rounds == [admission.LAUNCH_ROUND] * (1024 // admission.LAUNCH_ROUND)
    assert state.started == len(state.in_flight) == admission.capacity(p) == 1024
    assert state.next_group == 128  # groups drawn once each, in order, across the rounds
    odd, s2 = plan(frozenlake_task(group_size=3), async_bound=0, batch_size=9), TrainingState()
    assert len(admission.launches(odd, s2, "j", most=4)) == 6  # a round ends after the group that reaches it


def test_grouped_tasks_drawn_together_share_one_workflow_per_task() -> None:
    """Per-episode trajectories first, in draw order, then one wave per grouped task (named after its first
    group); every member tracked as in flight on the workflow that plays it."""
    lake = frozenlake_task(group_size=2, weight=1.0)
    lakeg = frozenlake_task(name="lakeg", group_size=2, rollout_unit="group", weight=1.0)
    p, state = (
        plan(lake, lakeg, arithmetic_task(group_size=2, weight=1.0), async_bound=1, batch_size=8),
        TrainingState(),
    )
    launches = admission.launches(p, state, "j")
    by_unit = Counter(x.unit for x in launches)
    assert set(by_unit) == {Unit.TRAJECTORY, Unit.GROUP, Unit.SINGLE_TURN_WAVE}
    assert by_unit[Unit.GROUP] == by_unit[Unit.SINGLE_TURN_WAVE] == 1
    first_grouped = next(i for i, x in enumerate(launches) if x.unit.grouped)
    assert all(x.unit is Unit.TRAJECTORY for x in launches[:first_grouped])
    assert all(x.unit.grouped for x in launches[first_grouped:])
    for x in launches[first_grouped:]:
        assert x.workflow_id == f"{x.groups[0].group_id}-w" and len({g.task.name for g in x.groups}) == 1
        assert all(state.in_flight[tid].workflow == x.workflow_id for tid, _ in x.members())
    assert state.started == sum(len(x.members()) for x in launches) == 16
    drawn = sorted(g.group_id for x in launches for g in x.groups if x.unit.grouped or x.member == 0)
    assert drawn == [f"j-g{g:06d}" for g in range(8)]  # every drawn group is played, once


def test_batch_mode_plays_per_episode_tasks_in_one_lockstep_batch_and_groups_phase_by_phase() -> None:
    lake = frozenlake_task(group_size=2, weight=1.0)
    lakeg = frozenlake_task(name="lakeg", group_size=2, rollout_unit="group", weight=1.0)
    p = plan(lake, lakeg, async_bound=0, batch_size=4, rollout_mode="batch")
    state = TrainingState()
    launches = admission.launches(p, state, "j")
    assert [x.unit for x in launches] == [Unit.LOCKSTEP_BATCH, Unit.GROUP]  # one draw of a batch's worth
    batch, wave = launches
    assert batch.workflow_id == f"{batch.groups[0].group_id}-b"
    assert [tid for tid, _ in batch.members()] == [f"{batch.workflow_id}-{i:03d}" for i in range(2 * len(batch.groups))]
    inp = admission.child_input(p, batch, "j", 3, "parent")
    assert isinstance(inp, BatchRolloutInput) and inp.report_to == "parent"
    assert [t.trajectory_id for t in inp.trajectories] == [tid for tid, _ in batch.members()]
    assert all(t.min_version == 3 and t.group_id for t in inp.trajectories)
    group = admission.child_input(p, wave, "j", 3, "parent")
    assert isinstance(group, GroupRolloutInput) and group.lockstep
    assert [g.member_ids for g in group.groups] == [[f"{g.group_id}-0", f"{g.group_id}-1"] for g in wave.groups]
    assert state.started == 4


def test_a_trajectory_launch_plays_its_groups_seed_for_the_parent() -> None:
    p, state = plan(frozenlake_task(group_size=2), seed=7), TrainingState(step=2)
    first = admission.launches(p, state, "j")[0]
    inp = admission.child_input(p, first, "j", state.step, "parent")
    assert isinstance(inp, TrajectoryInput)
    assert (inp.seed, inp.group_id, inp.min_version, inp.report_to) == (7000021, "j-g000000", 2, "parent")
    assert inp.trajectory_id == ""  # its own workflow's id names it
    wave = admission.launches(plan(arithmetic_task(group_size=2)), TrainingState(), "j")
    assert [x.unit for x in wave] == [Unit.SINGLE_TURN_WAVE]
    assert not admission.child_input(p, wave[0], "j", 0, "parent").lockstep  # type: ignore[union-attr]


def test_a_group_workflow_plays_at_most_groups_per_workflow_multi_turn_groups() -> None:
    """20 multi-turn groups drawn at once go to workflows of at most 8 (each named after its first group, every
    group played once); a single-turn wave takes them all: its history does not grow with them."""
    lakeg = frozenlake_task(name="lakeg", group_size=2, rollout_unit="group")
    state = TrainingState()
    launches = admission.launches(plan(lakeg, async_bound=1, batch_size=20, groups_per_workflow=8), state, "j")
    assert [len(x.groups) for x in launches] == [8, 8, 4]
    assert [x.workflow_id for x in launches] == [f"j-g{g:06d}-w" for g in (0, 8, 16)]
    assert sorted(g.group_id for x in launches for g in x.groups) == [f"j-g{g:06d}" for g in range(20)]
    assert all(state.in_flight[tid].workflow == x.workflow_id for x in launches for tid, _ in x.members())
    wave = admission.launches(plan(arithmetic_task(group_size=2), async_bound=1, batch_size=20), TrainingState(), "j")
    assert [len(x.groups) for x in wave] == [20]
    lockstep = plan(lakeg, async_bound=0, batch_size=20, groups_per_workflow=8, rollout_mode="batch")
    assert [len(x.groups) for x in admission.launches(lockstep, TrainingState(), "j")] == [10]  # one barrier
