"""Admission: how much may be in flight, which task group g draws, and what one launch starts.

At most `training.in_flight_limit` ((bound + 1) × batch, more with dynamic sampling's oversample) trajectories
are in flight or buffered, and with `training.admission.adaptive` at most the engine-pressure cap of
workflows/training/pressure.py in flight. A launch draws groups while the next one fits and says which child
workflow plays each (spec/routing.py decides the unit); the training workflow only starts them. Pure and deterministic:
it updates the `TrainingState` it is given (the ids drawn, the members tracked as in flight) and returns what
to start, in the order the workflow starts it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rollart.contracts import ids
from rollart.contracts.rollouts import BatchRolloutInput, GroupRolloutInput, GroupSeed, TrajectoryInput
from rollart.contracts.training import InFlight, TrainingPlan, TrainingState
from rollart.spec.config import TaskSpec
from rollart.spec.routing import Unit, unit_of
from rollart.workflows.training import lengths, placement, pressure

__all__ = [
    "LAUNCH_ROUND",
    "ChildInput",
    "Group",
    "Launch",
    "can_launch",
    "capacity",
    "child_input",
    "draw_group",
    "launches",
    "next_launch_size",
    "next_task",
]

ChildInput = TrajectoryInput | BatchRolloutInput | GroupRolloutInput


@dataclass(frozen=True)
class Group:
    """A GRPO group drawn for launch: its id, its task and the env seed all its members share."""

    group_id: str
    task: TaskSpec
    seed: int
    predicted_turns: float | None = None  # its task's recent mean length (engine.priority: predicted)


@dataclass(frozen=True)
class Launch:
    """One child workflow to start: the unit it plays, its workflow id and its groups.

    A `trajectory` launch is one member (`member`) of its one group; a `lockstep_batch` plays every member of
    its groups, a grouped unit (`group`, `single_turn_wave`) every group of one task drawn in the launch.
    """

    unit: Unit
    workflow_id: str
    groups: tuple[Group, ...]
    member: int = 0

    def members(self) -> list[tuple[str, Group]]:
        """The trajectory ids it plays, each with its group, in the order they are tracked and reported."""
        if self.unit is Unit.TRAJECTORY:
            return [(self.workflow_id, self.groups[0])]
        if self.unit is Unit.LOCKSTEP_BATCH:
            episodes = [g for g in self.groups for _ in range(g.task.group_size)]
            return [(ids.batch_member_id(self.workflow_id, i), g) for i, g in enumerate(episodes)]
        return [(ids.member_id(g.group_id, m), g) for g in self.groups for m in range(g.task.group_size)]


def capacity(plan: TrainingPlan) -> int:
    """Trajectories in flight plus buffered, at most."""
    return plan.training.in_flight_limit


def next_task(plan: TrainingPlan, g: int) -> TaskSpec:
    """Group g's task, drawn by weight, reproducibly: it depends only on (training.seed, g)."""
    rng = random.Random(ids.derive_seed(plan.training.seed, g))
    return rng.choices(plan.tasks, weights=[task.weight for task in plan.tasks])[0]


def next_launch_size(plan: TrainingPlan, state: TrainingState) -> int:
    """Trajectories the next launch adds: a batch in batch mode, else the next group."""
    if plan.training.rollout_mode == "batch":
        return plan.training.batch_size
    return next_task(plan, state.next_group).group_size


LAUNCH_ROUND = 128
"""Trajectories the training workflow draws in one launch round at most. It may continue as new between rounds, and a
paper-sized window (1,024 and more) takes long enough to start that most of it reports meanwhile: launched whole, the
soak's first run took 1,011 reports and 15 % of the event limit before it could continue (`bench temporal`)."""


def can_launch(plan: TrainingPlan, state: TrainingState) -> bool:
    """Not paused or stopping, and the next launch fits under the capacity (in flight plus buffered) and under the
    engine-pressure cap (in flight), when admission is adaptive."""
    if state.paused or state.stop_requested:
        return False
    size = next_launch_size(plan, state)
    if len(state.in_flight) + len(state.buffer) + size > capacity(plan):
        return False
    cap = pressure.current_cap(plan, state)
    return cap is None or len(state.in_flight) + size <= cap


def draw_group(plan: TrainingPlan, state: TrainingState, job_id: str) -> Group:
    """The next group: its id and env seed from its index, its task by weight (an auto task on its planned pool);
    its members count as unfinished."""
    g = state.next_group
    task = placement.placed(state, next_task(plan, g))
    state.next_group += 1
    state.unfinished[ids.group_id(job_id, g)] = task.group_size
    predicted = lengths.predicted(plan, state, task.name)
    return Group(ids.group_id(job_id, g), task, ids.derive_seed(plan.training.seed, g), predicted)


def launches(plan: TrainingPlan, state: TrainingState, job_id: str, most: int | None = None) -> list[Launch]:
    """Everything admission allows now, drawn in one go (one workflow task), its members tracked as in flight;
    with `most`, drawing stops once that many trajectories were drawn (`LAUNCH_ROUND`: the rest comes next round).

    Trajectory mode draws a group at a time, batch mode a batch's worth. Per-episode tasks start a
    TrajectoryWorkflow per member, or join one lockstep batch per draw in batch mode; the grouped groups of a
    task drawn now share one GroupRolloutWorkflow (a single-turn wave, or multi-turn groups each on its own, or
    phase by phase with the others in batch mode). In trajectory mode a workflow plays at most
    `training.groups_per_workflow` multi-turn groups, so its history stays small whatever the batch (batch mode
    keeps its one barrier; a single-turn wave's history does not grow with its groups).
    The batches and trajectories come first, in draw order, then the grouped units: full ones as they filled, then
    the rest in the order their tasks were first drawn.
    """
    mode = plan.training.rollout_mode
    starts: list[Launch] = []
    grouped: dict[str, tuple[str, Unit, list[Group]]] = {}  # task → (workflow id, unit, its groups)
    full: list[Launch] = []  # multi-turn group workflows that reached training.groups_per_workflow
    first = state.started
    while can_launch(plan, state) and (most is None or state.started - first < most):
        drawn: list[Group] = []
        target = plan.training.batch_size if mode == "batch" else 1
        while sum(d.task.group_size for d in drawn) < target or not drawn:
            drawn.append(draw_group(plan, state, job_id))
        units = [unit_of(d.task, mode) for d in drawn]
        batch = tuple(d for d, unit in zip(drawn, units) if unit is Unit.LOCKSTEP_BATCH)
        if batch:
            starts.append(_track(state, Launch(Unit.LOCKSTEP_BATCH, ids.batch_id(batch[0].group_id), batch)))
        for d, unit in zip(drawn, units):
            if unit is Unit.TRAJECTORY:
                for m in range(d.task.group_size):
                    starts.append(_track(state, Launch(unit, ids.member_id(d.group_id, m), (d,), member=m)))
        for d, unit in zip(drawn, units):
            if unit.grouped:
                wid, _, groups = grouped.setdefault(d.task.name, (ids.wave_id(d.group_id), unit, []))
                if unit is Unit.GROUP and mode == "trajectory" and len(groups) == plan.training.groups_per_workflow:
                    full.append(Launch(unit, wid, tuple(groups)))  # full: the next group starts another
                    wid, _, groups = grouped[d.task.name] = (ids.wave_id(d.group_id), unit, [])
                groups.append(d)
                _track(state, Launch(unit, wid, (d,)))  # tracked now: admission must see them
    return starts + full + [Launch(unit, wid, tuple(groups)) for wid, unit, groups in grouped.values()]


def _track(state: TrainingState, launch: Launch) -> Launch:
    """Its members are in flight (and started) from now on."""
    for tid, group in launch.members():
        state.in_flight[tid] = InFlight(group=group.group_id, workflow=launch.workflow_id)
        state.started += 1
    return launch


def child_input(plan: TrainingPlan, launch: Launch, job_id: str, step: int, report_to: str) -> ChildInput:
    """The input of the child workflow that plays `launch`, started at `step` by the workflow `report_to`."""

    def episode(group: Group) -> TrajectoryInput:
        return TrajectoryInput(
            task=group.task,
            seed=group.seed,
            job_id=job_id,
            group_id=group.group_id,
            min_version=step,
            report_to=report_to,
            queue_prefix=plan.queue_prefix,
            affinity=plan.affinity,
            priority=plan.priority,
            predicted_turns=group.predicted_turns,
        )

    if launch.unit is Unit.TRAJECTORY:
        return episode(launch.groups[0])
    if launch.unit is Unit.LOCKSTEP_BATCH:
        trajectories = [episode(g).model_copy(update={"trajectory_id": tid}) for tid, g in launch.members()]
        return BatchRolloutInput(trajectories=trajectories, report_to=report_to)
    return GroupRolloutInput(
        task=launch.groups[0].task,
        job_id=job_id,
        min_version=step,
        report_to=report_to,
        groups=[
            GroupSeed(
                group_id=g.group_id,
                seed=g.seed,
                member_ids=[ids.member_id(g.group_id, m) for m in range(g.task.group_size)],
            )
            for g in launch.groups
        ],
        queue_prefix=plan.queue_prefix,
        affinity=plan.affinity,
        priority=plan.priority,
        predicted_turns=launch.groups[0].predicted_turns,
        lockstep=plan.training.rollout_mode == "batch",
        group_play=launch.groups[0].task.group_play,
    )
