"""The training loop's reactions, once: what a report does, when the loop wakes, what a step is trained with and
what follows it. Pure: no Temporal call, no clock of its own.

Two shells run this loop: `TrainingWorkflow` (workflow.py) on Temporal, and the simulator's `SimTraining`
(simulator/shell.py) on virtual time. Each does only its own I/O (child workflows or simulated children,
the train-step activity or a modelled step time, signals, stalls, continue-as-new) and calls these functions at
the same points, so a change to the loop's reaction is made here and seen in both:

    while running(plan, s):
        before_launch(plan, s); start admission.launches(...)
        wait until awake(plan, s, book)
        if step_due(plan, s, book):
            batch, trainer = next_batch(plan, s, book)
            result = train(batch, trainer)
            after_step(plan, s, trainer, batch, result, now)
    on each report: on_results(plan, s, book, results)
    on a unit that ended without reporting: on_lost(plan, s, book, workflow, error, error_type)
    after either: giving_up(plan, s) ends the job with a reason

`Ledger` answers the loop's questions about the buffer with the pure modules (ledger.py, staleness.py). The
simulator may pass an index that gives the same answers faster at 10,000 in flight (same interface).
"""

from __future__ import annotations

from dataclasses import dataclass

from rollart.contracts.activities import SampleRef, TrainStepResult
from rollart.contracts.rollouts import TrajectoryResult
from rollart.contracts.training import StepRecord, TrainingPlan, TrainingState
from rollart.spec.config import TrainerConfig
from rollart.workflows import entropy_control
from rollart.workflows.training import admission, failing, ledger, lengths, placement, pressure, records, staleness

__all__ = [
    "Ledger",
    "StepOutcome",
    "after_step",
    "awake",
    "before_launch",
    "giving_up",
    "next_batch",
    "on_lost",
    "on_results",
    "running",
    "step_due",
]


class Ledger:
    """The buffer's answers for the loop, from the pure modules. The hooks (`accepting`, `accepted`, `settled`)
    tell an index what changed; here there is nothing to keep."""

    def __init__(self, plan: TrainingPlan) -> None:
        self.plan = plan

    def accepting(self, state: TrainingState, results: list[TrajectoryResult]) -> None:
        """Results about to go into the ledger."""

    def accepted(self, state: TrainingState) -> None:
        """`ledger.accept` took results in."""

    def settled(self, state: TrainingState) -> None:
        """Groups left the ready list (a batch taken, stale groups dropped)."""

    def batch_ready(self, s: TrainingState) -> bool:
        return ledger.batch_ready(self.plan, s)

    def train_partial(self, s: TrainingState) -> bool:
        return ledger.train_partial(self.plan, s)

    def stale_ready(self, s: TrainingState) -> bool:
        return staleness.stale_ready(s, self.plan.training.async_bound)

    def take_batch(self, s: TrainingState) -> list[SampleRef]:
        return ledger.take_batch(self.plan, s)

    def drop_stale(self, s: TrainingState) -> int:
        return staleness.drop_stale(s, self.plan.training.async_bound)


def running(plan: TrainingPlan, s: TrainingState) -> bool:
    """The loop goes on: steps left, no `stop` signal, and its stop rule has not ended it."""
    return s.step < plan.training.steps and not s.stop_requested and s.ended_by is None


def before_launch(plan: TrainingPlan, s: TrainingState) -> bool:
    """Before the first launch, the first placement of `generate_pool: auto` tasks; whether it was made now."""
    if plan.placement_pools and s.placement is None:
        placement.start(plan, s)
        return True
    return False


def on_results(plan: TrainingPlan, s: TrainingState, book: Ledger, results: list[TrajectoryResult]) -> int:
    """Finished trajectories into the state, in the order that matters: the engines' pressure and placement's
    measurements first (they tell repeats by what is still in flight), then the ledger. How many were new."""
    pressure.observe(plan, s, results)
    placement.observe(s, results)
    lengths.observe(plan, s, results)
    failing.observe(s, results)
    book.accepting(s, results)
    accepted = ledger.accept(plan, s, results)
    book.accepted(s)
    return accepted


def on_lost(
    plan: TrainingPlan, s: TrainingState, book: Ledger, workflow: str, error: str, error_type: str | None = None
) -> int:
    """The trajectories of a unit's workflow that ended without reporting them (it failed, timed out or was
    terminated, or its report never arrived): failed, masked, never lost. Nothing of theirs was measured, so only
    the failure run and the ledger take them in. How many there were."""
    lost = [
        TrajectoryResult(trajectory_id=t, task="", seed=0, status="failed", error=error, error_type=error_type)
        for t, x in s.in_flight.items()
        if x.workflow == workflow
    ]
    if not lost:
        return 0
    failing.observe(s, lost)
    book.accepting(s, lost)
    accepted = ledger.accept(plan, s, lost)
    book.accepted(s)
    return accepted


def giving_up(plan: TrainingPlan, s: TrainingState) -> str | None:
    """After reports: why the job should fail now, its trajectories failing for one reason in a row (failing.py)."""
    return failing.verdict(plan, s)


def awake(plan: TrainingPlan, s: TrainingState, book: Ledger) -> bool:
    """Whether the waiting loop has something to do: a batch, room to launch, a partial batch to train, a stop,
    or stale ready groups to drop (they may be all the buffer holds)."""
    return (
        book.batch_ready(s)
        or admission.can_launch(plan, s)
        or book.train_partial(s)
        or s.stop_requested
        or book.stale_ready(s)
    )


def step_due(plan: TrainingPlan, s: TrainingState, book: Ledger) -> bool:
    """Once awake: drop the groups too stale to train, then whether a step is due (a full or a partial batch)."""
    if book.stale_ready(s):
        book.drop_stale(s)
        book.settled(s)
    return book.batch_ready(s) or book.train_partial(s)


def next_batch(plan: TrainingPlan, s: TrainingState, book: Ledger) -> tuple[list[SampleRef], TrainerConfig]:
    """The step's batch, out of the buffer, and the trainer config it is trained with (entropy control's weight)."""
    batch = book.take_batch(s)
    book.settled(s)
    return batch, entropy_control.trainer_for_step(plan.trainer, s.entropy_coef)


@dataclass(frozen=True)
class StepOutcome:
    """What a trained step did: its record, whether the stop rule ended the job, whether placement moved."""

    record: StepRecord
    learned: bool
    replanned: bool
    moved: bool


def after_step(
    plan: TrainingPlan,
    s: TrainingState,
    trainer: TrainerConfig,
    batch: list[SampleRef],
    result: TrainStepResult,
    now: float,
) -> StepOutcome:
    """Book a trained step (the new version, entropy control, the record), apply the stop rule, and re-plan the
    placement when due."""
    record = records.apply_step(s, trainer, batch, result, now, pressure.current_cap(plan, s))
    learned = records.learned(plan, s, record)
    replanned = placement.due(plan, s)
    moved = replanned and placement.replan(plan, s)
    return StepOutcome(record, learned, replanned, moved)
