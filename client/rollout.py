"""Starting trajectories from the client side: plan N episodes of a job, run them, collect outcomes."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import WorkflowAlreadyStartedError

from rollart.client.connection import Outage, retry_unreachable
from rollart.contracts import ids
from rollart.contracts.rollouts import GroupRolloutInput, GroupSeed, TrajectoryInput, TrajectoryResult
from rollart.infra.temporal import search_attributes as sa
from rollart.spec.config import JobSpec
from rollart.spec.pools import Pool, queue_name
from rollart.spec.routing import Unit, unit_of
from rollart.workflows.ui_summary import group_summary, trajectory_summary

__all__ = [
    "RolloutOutcome",
    "new_job_id",
    "plan_trajectories",
    "rollout_units",
    "run_rollout",
    "unit_input",
]


@dataclass(frozen=True)
class RolloutOutcome:
    """One started trajectory and how it ended; `result` is None when the workflow itself failed."""

    workflow_id: str
    run_id: str
    inp: TrajectoryInput
    result: TrajectoryResult | None
    error: str | None
    wall_s: float

    @property
    def status(self) -> str:
        return self.result.status if self.result else "error"


def new_job_id(job: JobSpec) -> str:
    """`<job name>-<UTC time>-<random>`: sortable and unique."""
    return f"{job.name}-{datetime.now(UTC):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:4]}"


def plan_trajectories(job: JobSpec, n: int, seed: int, job_id: str = "") -> list[TrajectoryInput]:
    """N episodes: tasks drawn by weight; each draw yields `group_size` episodes on one env seed."""
    rng = random.Random(seed)
    weights = [t.weight for t in job.tasks]
    plan: list[TrajectoryInput] = []
    group = 0
    while len(plan) < n:
        task = rng.choices(job.tasks, weights=weights)[0]
        env_seed = ids.derive_seed(seed, group)
        for _ in range(min(task.group_size, n - len(plan))):
            plan.append(
                TrajectoryInput(
                    task=job.unplaced(task),
                    seed=env_seed,
                    job_id=job_id,
                    queue_prefix=job.temporal.task_queue_prefix,
                    affinity=job.engine.affinity,
                    priority=job.engine.priority,
                )
            )
        group += 1
    return plan


async def run_rollout(
    client: Client,
    inputs: list[TrajectoryInput],
    job_id: str,
    on_done: Callable[[RolloutOutcome], None] | None = None,
    max_starts_in_flight: int = 64,
    outage: Outage | None = None,
) -> list[RolloutOutcome]:
    """Start every trajectory on the control queue and wait for all; order follows `inputs`.

    A server outage is waited out (`outage` says when it starts and ends): starts and result waits that
    fail because the server is unreachable are tried again.

    Each unit plays as training plays it (spec/routing.py): the members of a group of a single-turn or
    `rollout_unit: group` task (consecutive inputs on one seed) in one GroupRolloutWorkflow, every other input in
    a TrajectoryWorkflow of its own. Each carries
    a one-line summary for the Temporal UI, and `RollartJobId` and `RollartTask` once the namespace has
    rollart's search attributes (registered here if missing; without them, it ends without its outcome's).
    """
    starts = asyncio.Semaphore(max_starts_in_flight)
    watch = outage or Outage()
    registered = await retry_unreachable(lambda: sa.try_register(client), watch)

    async def unit(first: int, members: list[TrajectoryInput]) -> list[RolloutOutcome]:
        kind, workflow_id, inp = unit_input(first, members, job_id)
        result_type = list[TrajectoryResult] if kind.grouped else TrajectoryResult
        t0 = time.monotonic()
        queue = queue_name(Pool.CONTROL, members[0].queue_prefix)
        attributes = (
            TypedSearchAttributes([SearchAttributePair(sa.JOB_ID, job_id), SearchAttributePair(sa.TASK, inp.task.name)])
            if registered
            else None
        )
        summary = trajectory_summary(inp) if isinstance(inp, TrajectoryInput) else group_summary(inp)
        async with starts:
            handle = await retry_unreachable(
                lambda: _start(client, kind.workflow, inp, workflow_id, queue, result_type, attributes, summary), watch
            )
        try:
            result, error = await retry_unreachable(handle.result, watch), None
        except WorkflowFailureError as e:
            result, error = None, str(e.cause or e)
        results = result if isinstance(result, list) else [result] * len(members)
        outcomes = [
            RolloutOutcome(workflow_id, handle.result_run_id or "", m, r, error, time.monotonic() - t0)
            for m, r in zip(members, results)
        ]
        for outcome in outcomes if on_done else []:
            on_done(outcome)
        return outcomes

    units = await asyncio.gather(*(unit(first, members) for first, members in rollout_units(inputs)))
    return [outcome for outcomes in units for outcome in outcomes]


async def _start(
    client: Client,
    workflow_type: str,
    inp: object,
    workflow_id: str,
    queue: str,
    result_type: type,
    attributes: TypedSearchAttributes | None,
    summary: str,
) -> WorkflowHandle:
    """Start one unit's workflow; one already started (a retried start whose answer was lost) is taken as it is."""
    try:
        return await client.start_workflow(
            workflow_type,
            inp,
            id=workflow_id,
            result_type=result_type,
            task_queue=queue,
            search_attributes=attributes,
            static_summary=summary,
        )
    except WorkflowAlreadyStartedError:
        return client.get_workflow_handle(workflow_id, result_type=result_type)


def unit_input(
    first: int, members: list[TrajectoryInput], job_id: str
) -> tuple[Unit, str, TrajectoryInput | GroupRolloutInput]:
    """One unit of `rollout_units`: what plays it (`Unit.workflow`), its workflow id and its input.

    One episode of a per-episode task: a TrajectoryWorkflow. Members of a group of a grouped task (single-turn, or
    `rollout_unit: group`): one GroupRolloutWorkflow whose single group is named after the workflow (its members
    `<id>-<m>`).
    """
    inp = members[0]
    workflow_id = ids.unit_id(job_id, inp.task.name, first)
    unit = unit_of(inp.task)
    if not unit.grouped:
        return unit, workflow_id, inp
    task = inp.task.model_copy(update={"group_size": len(members)})  # the last group may be cut short
    group = GroupRolloutInput(
        task=task,
        groups=[GroupSeed(group_id=workflow_id, seed=inp.seed)],
        job_id=inp.job_id,
        min_version=inp.min_version,
        queue_prefix=inp.queue_prefix,
        affinity=inp.affinity,
        priority=inp.priority,
        predicted_turns=inp.predicted_turns,
        group_play=task.group_play,
    )
    return unit, workflow_id, group


def rollout_units(inputs: list[TrajectoryInput]) -> list[tuple[int, list[TrajectoryInput]]]:
    """(index of the first input, the inputs) per workflow: a group's consecutive members on one seed, or one input."""
    units: list[tuple[int, list[TrajectoryInput]]] = []
    for i, inp in enumerate(inputs):
        last = units[-1][1] if units else None
        if (
            last
            and unit_of(inp.task).grouped
            and last[0].task == inp.task
            and last[0].seed == inp.seed
            and len(last) < inp.task.group_size
        ):
            last.append(inp)
        else:
            units.append((i, [inp]))
    return units
