"""TrainingWorkflow: keeps trajectories in flight, trains on finished ones under the async bound.

A thin shell: the decisions are pure modules beside it (admission, ledger, staleness, filtering, records; see
the package's docstring). It keeps the signals and the query, the loop, the child starts, the train-step
activity, stall watching and continue-as-new.

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

from temporalio import workflow
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from rollart.contracts.activities import (
        ActivityName,
        DescribeQueuesInput,
        DescribeQueuesResult,
        QueueState,
        TrainStepInput,
        TrainStepResult,
    )
    from rollart.contracts.errors import ErrorType, failure_of
    from rollart.contracts.rollouts import (
        BatchRolloutInput,
        ChildOutcome,
        DescribeChildrenInput,
        DescribeChildrenResult,
        TrajectoryInput,
        TrajectoryResult,
    )
    from rollart.contracts.training import TrainingInput, TrainingPlan, TrainingResult, TrainingState, TrainingStatus
    from rollart.infra.temporal import search_attributes as sa
    from rollart.spec.config import TaskSpec
    from rollart.spec.pools import Pool, queue_name
    from rollart.workflows import policies, stalls
    from rollart.workflows.batch_rollout import BatchRolloutWorkflow
    from rollart.workflows.group_rollout import GroupRolloutWorkflow
    from rollart.workflows.reporting import TRAJECTORIES_DONE
    from rollart.workflows.training import admission, continuation, loop, records
    from rollart.workflows.training.admission import Launch
    from rollart.workflows.trajectory import TrajectoryWorkflow
    from rollart.workflows.ui_summary import batch_summary, group_summary, trajectory_summary

__all__ = ["CHILDREN_PER_CHECK", "CHILDREN_PER_TASK", "TrainingWorkflow"]

CHILDREN_PER_CHECK = 500
"""Units asked about in one `describe_children` call (its input stays well under Temporal's payload limits)."""

CHILDREN_PER_TASK = 500
"""Child workflows started (or cancelled) in one workflow task: its commands stay well under the 4 MB a task may
carry, whatever a launch or the end of a job holds."""


@workflow.defn(name="TrainingWorkflow", failure_exception_types=[ValidationError])
class TrainingWorkflow:
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
            if loop.step_due(plan, s, self.book):
                await self._train_step()
                self.steps_this_run += 1
            why = self._continue_reason()
            if why is not None and loop.running(plan, s):
                workflow.logger.info("job %s continues as new at step %d: %s", inp.job_id, s.step, why)
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(self._carried(inp))
        return await self._finish()

    def _continue_reason(self) -> str | None:
        """Why this run should continue as new now, from what its history and signals have used (or None)."""
        info = workflow.info()
        use = continuation.RunUse(
            events=info.get_current_history_length(),
            bytes=info.get_current_history_size(),
            signals=self.signals,
            suggested=info.is_continue_as_new_suggested(),
            steps=self.steps_this_run,
            seconds=workflow.now().timestamp() - self.run_started,
        )
        return continuation.reason(self.plan.limits, self.plan.training.continue_as_new_every, use)

    def _carried(self, inp: TrainingInput) -> TrainingInput:
        return TrainingInput(plan=self.plan, job_id=inp.job_id, run_dir=inp.run_dir, state=self.s)

    # ------------------------------------------------------------ child starts

    async def _launch(self) -> None:
        """Start what admission allows (workflows/training/admission.py), `CHILDREN_PER_TASK` to a workflow task."""
        if loop.before_launch(self.plan, self.s):
            self._show_placement()
        launches = admission.launches(self.plan, self.s, self.inp.job_id)
        for i in range(0, len(launches), CHILDREN_PER_TASK):  # one workflow task's commands stay well under 4 MB
            await asyncio.gather(*(self._start(launch) for launch in launches[i : i + CHILDREN_PER_TASK]))

    async def _start(self, launch: Launch) -> None:
        """The child workflow that plays one launch, watched until it closes."""
        step = self.s.step
        inp = admission.child_input(self.plan, launch, self.inp.job_id, step, workflow.info().workflow_id)
        if isinstance(inp, TrajectoryInput):
            run, summary = TrajectoryWorkflow.run, trajectory_summary(inp, member=launch.member, version=step)
        elif isinstance(inp, BatchRolloutInput):
            run, summary = BatchRolloutWorkflow.run, batch_summary(inp, version=step)
        else:
            run, summary = GroupRolloutWorkflow.run, group_summary(inp, version=step)
        handle = await workflow.start_child_workflow(
            run,  # type: ignore[arg-type]
            inp,
            id=launch.workflow_id,
            task_queue=self._queue(Pool.CONTROL),
            parent_close_policy=workflow.ParentClosePolicy.ABANDON,
            search_attributes=self._child_attributes(launch.groups[0].task),
            static_summary=summary,
        )
        self.started_here.add(launch.workflow_id)
        asyncio.create_task(self._watch_child(launch.workflow_id, handle))  # noqa: RUF006  # the run holds it

    async def _watch_child(self, workflow_id: str, handle: workflow.ChildWorkflowHandle) -> None:
        """A unit this run started, until it closes: what it did not report is taken from how it ended."""
        try:
            value = await handle
        except ChildWorkflowError as err:
            error, error_type = failure_of(err)
            self._closed(ChildOutcome(workflow_id=workflow_id, status="failed", error=error, error_type=error_type))
            return
        values = value if isinstance(value, list) else [value]
        self._closed(ChildOutcome(workflow_id=workflow_id, status="completed", results=values))

    def _closed(self, child: ChildOutcome) -> None:
        """A unit's workflow closed: its unreported results into the ledger; what it never reported, failed."""
        if self.finishing:  # what is in flight as the job ends is cancelled, not failed
            return
        unreported = [r for r in child.results if r.trajectory_id in self.s.in_flight]
        if unreported:
            workflow.logger.warning(
                "%s completed without its report: %d results taken", child.workflow_id, len(unreported)
            )
            loop.on_results(self.plan, self.s, self.book, unreported)
        why = child.error or "it completed without reporting them"
        lost = loop.on_lost(
            self.plan, self.s, self.book, child.workflow_id, f"{child.workflow_id}: {why}", child.error_type
        )
        if lost:
            workflow.logger.warning("%s ended (%s): %d trajectories counted as failed", child.workflow_id, why, lost)
        self._give_up_maybe()

    def _give_up_maybe(self) -> None:
        """End the job once its trajectories keep failing for one reason no retry cures (loop.giving_up)."""
        why = loop.giving_up(self.plan, self.s)
        if why is not None and self.fatal is None and not self.finishing:
            self.fatal = ErrorType.JOB_FAILING.error(f"job {self.inp.job_id} is failing: {why}")

    def _queue(self, pool: Pool) -> str:
        return queue_name(pool, self.plan.queue_prefix)

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

    async def _cancel_in_flight(self) -> None:
        """Cancel the workflows of the trajectories still in flight (a lockstep batch or a group wave is one),
        `CHILDREN_PER_TASK` at once: a round trip per chunk, not per child."""
        wids = sorted({x.workflow for x in self.s.in_flight.values()})
        for i in range(0, len(wids), CHILDREN_PER_TASK):
            await asyncio.gather(*(self._cancel_child(wid) for wid in wids[i : i + CHILDREN_PER_TASK]))

    @staticmethod
    async def _cancel_child(wid: str) -> None:
        try:
            await workflow.get_external_workflow_handle(wid).cancel()
        except Exception as err:  # already finished between its signal and now
            workflow.logger.info("cancel of %s skipped: %s", wid, err)

    # ------------------------------------------------------------ stalls

    async def _watch_stalls(self) -> None:
        """Every `check_every_s`: describe the job's queues (one small activity) and keep the stall bookkeeping."""
        cfg = self.plan.training.stall
        pools = stalls.watched_pools(self.plan.tasks, self.plan.placement_pools)
        inp = DescribeQueuesInput(queues=[queue_name(p, self.plan.queue_prefix) for p in pools])
        while not self.finishing:  # once the job ends no command may follow its completion: no new timer
            await workflow.sleep(cfg.check_every_s)
            try:
                res: DescribeQueuesResult = await workflow.execute_activity(
                    ActivityName.DESCRIBE_QUEUES.value,
                    inp,
                    task_queue=self._queue(Pool.CONTROL),
                    result_type=DescribeQueuesResult,
                    **policies.DESCRIBE_QUEUES.kwargs(),
                )
            except ActivityError as err:
                if is_cancelled_exception(err):  # the watcher itself was cancelled (the run ends): stop here
                    raise
                workflow.logger.warning("stall check skipped: %s", err.cause or err)
                continue
            if not self.finishing:
                self._checked(dict(zip(pools, res.queues)))

    async def _watch_carried(self) -> None:
        """Every `stall.check_every_s`, ask about the units an earlier run started and that have not reported
        (`describe_children`, in chunks), until none is left: this run does not see them close."""
        every = self.plan.training.stall.check_every_s
        while not self.finishing:
            await workflow.sleep(every)
            running = {x.workflow for x in self.s.in_flight.values()}
            pending = sorted(w for w in self.carried if w in running)
            self.carried = set(pending)
            if not pending:
                return
            for i in range(0, len(pending), CHILDREN_PER_CHECK):
                try:
                    res: DescribeChildrenResult = await workflow.execute_activity(
                        ActivityName.DESCRIBE_CHILDREN.value,
                        DescribeChildrenInput(workflow_ids=pending[i : i + CHILDREN_PER_CHECK]),
                        task_queue=self._queue(Pool.CONTROL),
                        result_type=DescribeChildrenResult,
                        **policies.DESCRIBE_CHILDREN.kwargs(),
                    )
                except ActivityError as err:
                    if is_cancelled_exception(err):
                        raise
                    workflow.logger.warning("check of carried units skipped: %s", err.cause or err)
                    continue
                for child in res.closed:
                    self._closed(child)

    def _stalled_history_full(self) -> bool:
        """A long stall keeps adding checks to the history: start a fresh one (steps would, but none come)."""
        full = workflow.info().get_current_history_length() >= self.plan.training.stall.history_events_max
        return self.parked and bool(self.s.stall.stalls) and full

    def _checked(self, queues: dict[str, QueueState]) -> None:
        """Update the stalls from one check; say so in the log and the UI when they appear or clear."""
        cfg = self.plan.training.stall
        before = {(x.reason, x.pool) for x in self.s.stall.stalls}
        self.s.stall = stalls.check(self.s.stall, queues, workflow.now().timestamp(), len(self.s.in_flight), cfg)
        now = {(x.reason, x.pool) for x in self.s.stall.stalls}
        for x in self.s.stall.stalls:
            if (x.reason, x.pool) not in before:
                workflow.logger.warning("job %s stalled: %s", self.inp.job_id, x.describe())
        for reason, pool in before - now:
            workflow.logger.info("job %s: stall cleared (%s%s)", self.inp.job_id, reason, f" on {pool}" if pool else "")
        if before or now:
            workflow.set_current_details(stalls.summary(self.s.stall.stalls))
        over = stalls.overdue(self.s.stall, cfg)
        if over is not None:
            self.fatal = ErrorType.JOB_STALLED.error(
                f"job {self.inp.job_id} stalled: {over.describe()}; gave up after training.stall.fail_after_s = "
                f"{cfg.fail_after_s:g} s (start a worker for the pool, or raise or unset fail_after_s)",
                {"reason": over.reason, "pool": over.pool, "since": over.since},
            )
