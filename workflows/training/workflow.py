"""TrainingWorkflow: keeps trajectories in flight, trains on finished ones under the async bound.

A thin shell: the decisions are pure modules beside it (admission, ledger, staleness, filtering, records; see
the package's docstring). It keeps the signals and the query, the loop, the child starts, the train-step
activity and continue-as-new; what it watches beside the loop (its units, stalls) is in watching.py.

- Trajectories start as child workflows (parent-close: abandon) and report back by signal, so nothing is lost
  across continue-as-new (the id is stable). No trajectory is lost when a report is not: the run that started a
  unit watches it close (a unit that failed, timed out or was terminated counts its trajectories as failed;
  one whose report never came gives its results), and a run that continued as new asks the control worker
  about the units it carried (`describe_children`) until each has reported.
- A job whose trajectories keep failing for one reason no retry cures ends with that reason
  (`training.fail_after_failures`, workflows/training/failing.py).
- `trajectory` mode runs every unit on its own; `batch` mode a whole batch in lockstep (the synchronous
  baseline), with the same accounting.
- The job ends at `training.steps`, on the `stop` signal, or, with `training.stop_when`, once each step's
  success has held long enough.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from rollart.contracts.activities import (
        ActivityName,
        TrainStepInput,
        TrainStepResult,
    )
    from rollart.contracts.rollouts import (
        BatchRolloutInput,
        TrajectoryInput,
        TrajectoryResult,
    )
    from rollart.contracts.training import TrainingInput, TrainingPlan, TrainingResult, TrainingState, TrainingStatus
    from rollart.infra.temporal import search_attributes as sa
    from rollart.spec.config import TaskSpec
    from rollart.spec.pools import Pool
    from rollart.workflows import policies, stalls
    from rollart.workflows.batch_rollout import BatchRolloutWorkflow
    from rollart.workflows.group_rollout import GroupRolloutWorkflow
    from rollart.workflows.reporting import TRAJECTORIES_DONE
    from rollart.workflows.training import admission, continuation, loop, records
    from rollart.workflows.training.admission import Launch
    from rollart.workflows.training.watching import CHILDREN_PER_TASK, Watching
    from rollart.workflows.trajectory import TrajectoryWorkflow
    from rollart.workflows.ui_summary import batch_summary, group_summary, trajectory_summary

__all__ = ["TrainingWorkflow"]


@workflow.defn(name="TrainingWorkflow", failure_exception_types=[ValidationError])
class TrainingWorkflow(Watching):
    """One training job: rollout and training overlapped under the async bound."""

    @workflow.init
    def __init__(self, inp: TrainingInput) -> None:
        assert inp.plan is not None  # TrainingInput makes one from `job`
        self.inp = inp
        self.plan: TrainingPlan = inp.plan
        self.s = inp.state or TrainingState()
        self.finishing = False
        self.done = False
        self.fatal: ApplicationError | None = None  # a stall past training.stall.fail_after_s
        self.parked = False  # the loop waits for work between launches and steps
        self.book = loop.Ledger(self.plan)
        self.signals = 0  # signals this run has taken (the server refuses them past `temporal.limits.signals`)
        self.run_started = 0.0  # workflow time this run started (set in `run`)
        self.run_start_history = (0, 0)  # its history's events and bytes then (the carried state is in them)
        self.steps_this_run = 0
        self.started_here: set[str] = set()  # units' workflows this run started (it sees them close)
        self.carried = {x.workflow for x in self.s.in_flight.values()}  # units an earlier run started

    # ------------------------------------------------------------ control surface

    @workflow.signal(name=TRAJECTORIES_DONE)
    def trajectories_done(self, results: list[TrajectoryResult]) -> None:
        """Finished trajectories report here (workflows/training/ledger.py takes them in).

        Once the job is finishing, reports are left alone: what was in flight when the last step
        ended is counted as cancelled, not as failed, whatever its cancellation reports.
        """
        self.signals += 1
        if self.finishing:
            return
        if loop.on_results(self.plan, self.s, self.book, results) and self.plan.training.stall.enabled:
            self.s.stall = stalls.progressed(self.s.stall, workflow.now().timestamp(), finished=True)
        self._give_up_maybe()

    @workflow.signal
    def pause(self) -> None:
        """Stop launching trajectories (in-flight ones finish; training continues on what is buffered)."""
        self.signals += 1
        self.s.paused = True

    @workflow.signal
    def resume(self) -> None:
        """Launch trajectories again."""
        self.signals += 1
        self.s.paused = False

    @workflow.signal
    def stop(self) -> None:
        """Finish the current step, then end the job (in-flight trajectories are cancelled)."""
        self.signals += 1
        self.s.stop_requested = True

    @workflow.query
    def status(self) -> TrainingStatus:
        """Where the loop is, and every term of the trajectory ledger."""
        return records.status(self.inp.job_id, self.plan, self.s, done=self.done)

    # ------------------------------------------------------------ the loop

    @workflow.run
    async def run(self, inp: TrainingInput) -> TrainingResult:
        """The loop, watched beside it for stalls (`training.stall`) and, after a continue-as-new, for the units
        an earlier run started; a stall past `fail_after_s`, or trajectories that keep failing, end the job."""
        self.run_started = workflow.now().timestamp()
        info = workflow.info()
        self.run_start_history = (info.get_current_history_length(), info.get_current_history_size())
        if inp.state is None:
            self.s.started_at = self.run_started
        watchers = [asyncio.create_task(self._watch_stalls())] if self.plan.training.stall.enabled else []
        if self.carried:
            watchers.append(asyncio.create_task(self._watch_carried()))
        loop = asyncio.create_task(self._loop(inp))
        try:
            await workflow.wait_condition(lambda: loop.done() or self.fatal is not None or self._stalled_history_full())
        except asyncio.CancelledError:  # the job was cancelled: so is every unit still playing for it
            loop.cancel()
            self.finishing = True
            await self._cancel_in_flight()
            raise
        for watcher in watchers:
            watcher.cancel()
        if watchers:  # their cancellation lands before the run's last command, not after it
            await workflow.wait(watchers)
        if not loop.done() and self.fatal is not None:
            loop.cancel()
            self.finishing = True
            await self._cancel_in_flight()
            raise self.fatal
        if not loop.done():  # stalled long, parked between launches: a fresh history, the same state
            loop.cancel()
            await workflow.wait_condition(workflow.all_handlers_finished)
            workflow.continue_as_new(self._carried(inp))
        return loop.result()

    async def _loop(self, inp: TrainingInput) -> TrainingResult:
        """Launch, wait, train (workflows/training/loop.py decides); continue as new before the history nears the
        server's limits (workflows/training/continuation.py), between steps or while waiting; the result."""
        plan, s = self.plan, self.s
        while loop.running(plan, s):
            await self._launch()
            self.parked = True  # between launches and steps: the state is whole (a stalled run may continue-as-new)
            await workflow.wait_condition(lambda: loop.awake(plan, s, self.book) or self._continue_reason() is not None)
            self.parked = False
            why = None
            if loop.step_due(plan, s, self.book):
                why = self._continue_reason(before_step=True)  # else the step is this run's: it may take it
                if why is None:
                    await self._train_step()
                    self.steps_this_run += 1
            why = why or self._continue_reason()
            if why is not None and loop.running(plan, s):
                workflow.logger.info("job %s continues as new at step %d: %s", inp.job_id, s.step, why)
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(self._carried(inp))
        return await self._finish()

    def _continue_reason(self, before_step: bool = False) -> str | None:
        """Why this run should continue as new now, from what its history and signals have used (or None);
        `before_step`: a train step is due, during which the trajectories in flight go on reporting."""
        cap = self.plan.training.continue_as_new_every
        return continuation.reason(self.plan.limits, cap, self._run_use(), before_step)

    def _run_use(self) -> continuation.RunUse:
        """What this run has used so far, and what a step cost the runs before it."""
        info = workflow.info()
        return continuation.RunUse(
            events=info.get_current_history_length(),
            bytes=info.get_current_history_size(),
            signals=self.signals,
            suggested=info.is_continue_as_new_suggested(),
            steps=self.steps_this_run,
            seconds=workflow.now().timestamp() - self.run_started,
            start_events=self.run_start_history[0],
            start_bytes=self.run_start_history[1],
            in_flight=len(self.s.in_flight),
            past=continuation.largest(self.s.step_costs),
        )

    def _carried(self, inp: TrainingInput) -> TrainingInput:
        """The next run's input: the state, with what a step cost this run added to the costs it projects from."""
        self.s.step_costs = continuation.remember(self.s.step_costs, self._run_use())
        return TrainingInput(plan=self.plan, job_id=inp.job_id, run_dir=inp.run_dir, state=self.s)

    # ------------------------------------------------------------ child starts

    async def _launch(self) -> None:
        """Start what admission allows (workflows/training/admission.py), a round of at most `LAUNCH_ROUND`
        trajectories (the loop comes back for the rest, and may continue as new between rounds),
        `CHILDREN_PER_TASK` to a workflow task."""
        if loop.before_launch(self.plan, self.s):
            self._show_placement()
        launches = admission.launches(self.plan, self.s, self.inp.job_id, most=admission.LAUNCH_ROUND)
        for i in range(0, len(launches), CHILDREN_PER_TASK):  # one workflow task's commands stay well under 4 MB
            await asyncio.gather(*(self._start(launch) for launch in launches[i : i + CHILDREN_PER_TASK]))

    async def _start(self, launch: Launch) -> None:
        """The child workflow that plays one launch, watched until it closes."""
        step = self.s.step
        inp = admission.child_input(self.plan, launch, self.inp.job_id, step, workflow.info().workflow_id)
        # a unit's task goes as its own argument, stored once by content: the history holds a claim; the rest goes
        # without its defaults, which the unit fills in again (contracts/rollouts.py)
        if isinstance(inp, TrajectoryInput):
            run, summary = TrajectoryWorkflow.run, trajectory_summary(inp, member=launch.member, version=step)
        elif isinstance(inp, BatchRolloutInput):
            run, summary = BatchRolloutWorkflow.run, batch_summary(inp, version=step)
        else:
            run, summary = GroupRolloutWorkflow.run, group_summary(inp, version=step)
        if isinstance(inp, BatchRolloutInput):
            args: list[Any] = [inp]
        else:
            rest, task = inp.split()
            args = [rest.model_dump(mode="json", exclude_defaults=True), task]
        handle = await workflow.start_child_workflow(
            run,  # type: ignore[arg-type]
            args=args,
            id=launch.workflow_id,
            task_queue=self._queue(Pool.CONTROL),
            parent_close_policy=workflow.ParentClosePolicy.ABANDON,
            search_attributes=self._child_attributes(launch.groups[0].task),
            static_summary=summary,
        )
        self.started_here.add(launch.workflow_id)
        asyncio.create_task(self._watch_child(launch.workflow_id, handle))  # noqa: RUF006  # the run holds it

    def _child_attributes(self, task: TaskSpec) -> TypedSearchAttributes:
        return TypedSearchAttributes(
            [
                SearchAttributePair(sa.JOB_ID, self.inp.job_id),
                SearchAttributePair(sa.TASK, task.name),
                SearchAttributePair(sa.POLICY_VERSION, self.s.step),
            ]
        )

    # ------------------------------------------------------------ train steps and the end

    async def _train_step(self) -> None:
        inp, plan = self.inp, self.plan
        batch, trainer = loop.next_batch(plan, self.s, self.book)
        result: TrainStepResult = await workflow.execute_activity(
            ActivityName.TRAIN_STEP.value,
            TrainStepInput(
                job_id=inp.job_id,
                step=self.s.step,
                samples=batch,
                model_dir=plan.model_dir,
                run_dir=inp.run_dir,
                trainer=trainer,
                weights=plan.weights,
            ),
            task_queue=self._queue(Pool.TRAINER),
            result_type=TrainStepResult,
            **policies.TRAIN_STEP.kwargs(),
        )
        now = workflow.now().timestamp()
        if plan.training.stall.enabled:
            self.s.stall = stalls.progressed(self.s.stall, now, finished=False)
        outcome = loop.after_step(plan, self.s, trainer, batch, result, now)
        if outcome.learned:
            workflow.logger.info(
                "job %s learned: %s, ending at step %d of %d",
                inp.job_id,
                plan.training.stop_when.describe(),  # type: ignore[union-attr]
                self.s.step,
                plan.training.steps,
            )
        workflow.upsert_search_attributes([sa.STEP.value_set(self.s.step), sa.POLICY_VERSION.value_set(self.s.step)])
        if outcome.replanned:
            self._show_placement(outcome.moved)

    def _show_placement(self, moved: bool = False) -> None:
        """The placement of auto tasks in the log and in the workflow's memo (the Temporal UI shows it)."""
        p = self.s.placement
        assert p is not None
        workflow.logger.info(
            "job %s %s%s: %s", self.inp.job_id, p.describe(), " (moved)" if moved else "", "; ".join(p.reasons)
        )
        workflow.upsert_memo({"placement": p.describe(), "placement_reasons": p.reasons})

    async def _finish(self) -> TrainingResult:
        """Cancel what is still in flight (it can no longer be trained on) and report the ledger."""
        self.finishing = True
        await self._cancel_in_flight()
        if self.s.stall.open:  # a job that ends is stalled no more
            self.s.stall = self.s.stall.model_copy(update={"open": []})
            workflow.set_current_details("")
        self.s.ended_by = records.ended_by(self.plan, self.s)
        self.done = True
        return records.result(self.inp.job_id, self.plan, self.s)
