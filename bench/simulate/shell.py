"""The training workflow's loop, re-shelled for virtual time: the same pure decisions, no Temporal.

workflows/training/workflow.py is a thin shell around pure modules; this is another shell around the same
ones: `admission.launches` says what to start, the children play rollart's rollout driver on `SimCalls`
(as TrajectoryWorkflow, BatchRolloutWorkflow and GroupRolloutWorkflow do), their reports go through
`pressure.observe` and `ledger.accept`, and the loop wakes when a batch is ready, a launch fits, a partial batch
must be trained or a stale group must be dropped, exactly the workflow's wait condition. A train step takes
`TrainerModel.step_s` of the batch's tokens; `records.apply_step` books it, and the engines serve the new
version from then on. Tasks with `generate_pool: auto` are placed as the workflow places them, at the same
points: `placement.start` before the first launch, `placement.observe` on each report (after
`pressure.observe`, before the ledger), and after a train step `placement.replan` when `placement.due`; the
engines' own counts (`SimEngine`'s, in each result's `EnginePressure`) are the measured rates. Left out:
signals, stalls, continue-as-new, child-workflow ids in Temporal.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.simulate.calls import SimCalls
from bench.simulate.models import TrainerModel
from bench.simulate.readiness import Exact, Indexed
from rollart.contracts.activities import TrainStepResult
from rollart.contracts.rollouts import BatchRolloutInput, TrajectoryInput, TrajectoryResult
from rollart.contracts.training import TrainingPlan, TrainingState
from rollart.workflows.driver.episode import Episode
from rollart.workflows.driver.grouped import play_groups
from rollart.workflows.driver.lockstep import play
from rollart.workflows.training import admission, ledger, lengths, placement, pressure, records
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
        self.ready = Exact(plan) if exact else Indexed(plan)
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
        loop = asyncio.get_running_loop()
        if self.on_start is not None:
            self.on_start()
        if self.horizon_s is not None:
            loop.call_at(self.horizon_s, self._end)
        t, plan, s = self.plan.training, self.plan, self.s
        while s.step < t.steps and not self._over:
            self._launch()
            ready = self.ready
            while not self._over and not (
                ready.batch_ready(s) or admission.can_launch(plan, s) or ready.train_partial(s) or ready.stale_ready(s)
            ):
                self._wake.clear()
                await self._wake.wait()
            if self._over:
                break
            if ready.stale_ready(s):  # else drop_stale would find nothing (and scan the whole buffer to say so)
                ready.drop_stale(s)
                ready.settled(s)
            if ready.batch_ready(s) or ready.train_partial(s):
                await self._train_step()
        self.out.elapsed_s = loop.time()
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
        if self.plan.placement_pools and self.s.placement is None:
            placement.start(self.plan, self.s)
        if self.s.placement is not None and not self.out.placements:  # the spread, or a start the caller set
            self._placed(now)
        for launch in admission.launches(self.plan, self.s, JOB_ID):
            for tid, _ in launch.members():
                self._started_at[tid] = now
            task = asyncio.ensure_future(self._child(launch))
            self._children.add(task)
            task.add_done_callback(self._children.discard)

    async def _child(self, launch: Launch) -> None:
        """The child workflow of one launch, played as its workflow plays it."""
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
        pressure.observe(self.plan, self.s, results)
        placement.observe(self.s, results)
        lengths.observe(self.plan, self.s, results)
        self.ready.accepting(self.s, results)
        ledger.accept(self.plan, self.s, results)
        self.ready.accepted(self.s)
        self._wake.set()

    # ------------------------------------------------------------ train steps

    async def _train_step(self) -> None:
        loop = asyncio.get_running_loop()
        batch = self.ready.take_batch(self.s)
        self.ready.settled(self.s)
        if not batch:  # only failed members in the ready groups: nothing to train on (see the report)
            return
        tokens = sum(self._tokens.pop(x.trajectory_id, 0) for x in batch)
        took = self.trainer.step_s(tokens)
        await asyncio.sleep(took)
        self.out.train_busy_s += took
        self.out.tokens_trained += tokens
        step = self.s.step
        result = TrainStepResult(step=step, version=step + 1, weights_key=f"sim/{step + 1}")
        records.apply_step(
            self.s, self.plan.trainer, batch, result, loop.time(), pressure.current_cap(self.plan, self.s)
        )
        self.out.step_ends.append(loop.time())
        if placement.due(self.plan, self.s) and placement.replan(self.plan, self.s):
            self._placed(loop.time())
        self._wake.set()

    def _placed(self, now: float) -> None:
        """The auto tasks' placement as it is now, into the outcome's timeline."""
        if self.s.placement is not None:
            self.out.placements.append((now, self.s.step, dict(self.s.placement.assignment)))
