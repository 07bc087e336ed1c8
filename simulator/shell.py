"""The training loop on virtual time: workflows/training/loop.py's reactions in a second shell, no Temporal.

`TrainingWorkflow` and this shell call the same loop core at the same points (`loop.running`,
`loop.before_launch`, `loop.awake`, `loop.step_due`, `loop.next_batch`, `loop.after_step`, `loop.on_results`):
what a report does, when the loop wakes, which batch a step trains with which trainer config (entropy control),
the stop rule (`training.stop_when`) and placement's re-plans are decided once. This shell does its own I/O
only: `admission.launches` are played as children on rollart's rollout driver over `SimCalls` (as
TrajectoryWorkflow, BatchRolloutWorkflow and GroupRolloutWorkflow play them), and a train step takes
`TrainerModel.step_s` of the batch's tokens, after which the engines serve the new version. The engines' own
counts (`SimEngine`'s, in each result's `EnginePressure`) are the measured rates placement sees. Left out:
signals, stalls, continue-as-new, child-workflow ids in Temporal.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from rollart.contracts.activities import TrainStepResult
from rollart.contracts.errors import failure_of
from rollart.contracts.rollouts import BatchRolloutInput, TrajectoryInput, TrajectoryResult
from rollart.contracts.training import TrainingPlan, TrainingState
from rollart.simulator.calls import SimCalls
from rollart.simulator.models import TrainerModel
from rollart.simulator.readiness import Indexed
from rollart.workflows.driver.episode import Episode
from rollart.workflows.driver.grouped import play_groups
from rollart.workflows.driver.lockstep import play
from rollart.workflows.training import admission, loop
from rollart.workflows.training.admission import Launch

__all__ = ["Outcome", "SimTraining"]

JOB_ID = "sim"


@dataclass
class Outcome:
    """What a simulated run measured: its end, the ledger, trajectory times and the steps' times."""

    elapsed_s: float
    state: TrainingState
    trajectory_s: list[float] = field(default_factory=list)  # launch → report, per finished trajectory
    step_ends: list[float] = field(default_factory=list)  # virtual time at each train step's end
    train_busy_s: float = 0.0
    tokens_trained: int = 0
    completed: int = 0
    failed: int = 0
    placements: list[tuple[float, int, dict[str, str]]] = field(default_factory=list)
    """generate_pool: auto: (virtual time, step, the auto tasks' pools) at the first spread and at each move."""
    gave_up: str | None = None  # why the job failed (`training.fail_after_failures`), as the workflow fails it
    units: int = 0  # child workflows started (a trajectory, a group workflow, a lockstep batch)
    reports: int = 0  # report signals the training workflow took


class SimTraining:
    """One job's loop on virtual time: `run()` until `training.steps` steps or `horizon_s` seconds."""

    def __init__(
        self,
        plan: TrainingPlan,
        calls: SimCalls,
        trainer: TrainerModel,
        horizon_s: float | None = None,
        exact: bool = False,
    ) -> None:
        self.plan, self.calls, self.trainer, self.horizon_s = plan, calls, trainer, horizon_s
        self.book = loop.Ledger(plan) if exact else Indexed(plan)
        self.s = TrainingState()
        self.out = Outcome(0.0, self.s)
        self._wake = asyncio.Event()
        self._children: set[asyncio.Task[None]] = set()
        self._started_at: dict[str, float] = {}
        self._tokens: dict[str, int] = {}
        self._over = False
        self.on_start: Callable[[], None] | None = None  # called on the loop as the run starts (progress lines)

    @property
    def version(self) -> int:
        """The weights version the engines serve: the step the loop is at."""
        return self.s.step

    async def run(self) -> Outcome:
        clock = asyncio.get_running_loop()
        if self.on_start is not None:
            self.on_start()
        if self.horizon_s is not None:
            clock.call_at(self.horizon_s, self._end)
        plan, s = self.plan, self.s
        while loop.running(plan, s) and not self._over:
            self._launch()
            while not self._over and not loop.awake(plan, s, self.book):
                self._wake.clear()
                await self._wake.wait()
            if self._over:
                break
            if loop.step_due(plan, s, self.book):
                await self._train_step()
        self.out.elapsed_s = clock.time()
        for task in self._children:  # what is still in flight is cancelled, as the workflow's _finish does
            task.cancel()
        await asyncio.gather(*self._children, return_exceptions=True)
        return self.out

    def _end(self) -> None:
        self._over = True
        self._wake.set()

    # ------------------------------------------------------------ children

    def _launch(self) -> None:
        now = asyncio.get_running_loop().time()
        loop.before_launch(self.plan, self.s)
        if self.s.placement is not None and not self.out.placements:  # the spread, or a start the caller set
            self._placed(now)
        # in rounds, as the workflow draws them (the same groups in the same units); no time passes between them
        while launches := admission.launches(self.plan, self.s, JOB_ID, most=admission.LAUNCH_ROUND):
            for launch in launches:
                for tid, _ in launch.members():
                    self._started_at[tid] = now
                task = asyncio.ensure_future(self._child(launch))
                self._children.add(task)
                task.add_done_callback(self._children.discard)

    async def _child(self, launch: Launch) -> None:
        """The child workflow of one launch, played as its workflow plays it; one that fails (bad input raised out
        of it) counts what it did not report as failed, as the workflow's watch of its child does."""
        self.out.units += 1
        try:
            await self._play(launch)
        except Exception as err:
            if not self._over:
                error, error_type = failure_of(err)
                loop.on_lost(self.plan, self.s, self.book, launch.workflow_id, error, error_type)
                self._after_report()

    async def _play(self, launch: Launch) -> None:
        o = self.calls.overheads
        if o.child_s or o.activity_cpu_s:
            await asyncio.sleep(o.child_s + self.calls.orchestration_wait() - o.activity_s)
        inp = admission.child_input(self.plan, launch, JOB_ID, self.s.step, JOB_ID)
        calls = self.calls
        if isinstance(inp, TrajectoryInput):
            await play([Episode(calls, inp, launch.workflow_id)], self._report)
        elif isinstance(inp, BatchRolloutInput):
            episodes = [Episode(calls, x, x.trajectory_id or launch.workflow_id) for x in inp.trajectories]
            await play(episodes, self._report)
        else:  # GroupRolloutWorkflow: the one dispatch its workflow runs (a wave, free members, lockstep groups)
            await play_groups(calls, inp, self._report)

    async def _report(self, results: list[TrajectoryResult]) -> None:
        """The `trajectories_done` signal: the engines' reports, then the ledger."""
        if self._over:
            return
        self.out.reports += 1
        now = asyncio.get_running_loop().time()
        for r in results:
            if r.trajectory_id in self.s.in_flight:
                self.out.trajectory_s.append(now - self._started_at.pop(r.trajectory_id, now))
                if r.status == "completed":
                    self.out.completed += 1
                    # its sequence as trained: every completion, and its prompts' mean context (the turns' prompt
                    # tokens add up each turn's whole context; a single turn's is its prompt)
                    self._tokens[r.trajectory_id] = r.completion_tokens + r.prompt_tokens // max(1, r.turns)
                else:
                    self.out.failed += 1
        loop.on_results(self.plan, self.s, self.book, results)
        self._after_report()

    def _after_report(self) -> None:
        """Wake the loop; end the job if its trajectories keep failing (the workflow fails it then)."""
        why = loop.giving_up(self.plan, self.s)
        if why is not None and self.out.gave_up is None:
            self.out.gave_up = why
            self._end()
        self._wake.set()

    # ------------------------------------------------------------ train steps

    async def _train_step(self) -> None:
        clock = asyncio.get_running_loop()
        batch, trainer = loop.next_batch(self.plan, self.s, self.book)
        tokens = sum(self._tokens.pop(x.trajectory_id, 0) for x in batch)
        took = self.trainer.step_s(tokens)
        await asyncio.sleep(took)
        self.out.train_busy_s += took
        self.out.tokens_trained += tokens
        step = self.s.step
        result = TrainStepResult(
            step=step, version=step + 1, weights_key=f"sim/{step + 1}", metrics=dict(self.trainer.metrics)
        )
        outcome = loop.after_step(self.plan, self.s, trainer, batch, result, clock.time())
        self.out.step_ends.append(clock.time())
        if outcome.moved:
            self._placed(clock.time())
        self._wake.set()

    def _placed(self, now: float) -> None:
        """The auto tasks' placement as it is now, into the outcome's timeline."""
        if self.s.placement is not None:
            self.out.placements.append((now, self.s.step, dict(self.s.placement.assignment)))
