"""What the training workflow watches beside its loop: the units it started, the ones an earlier run started,
and its pools for stalls. A mixin of `TrainingWorkflow` (workflow.py), kept apart so each file reads on its own.

- A unit (a child workflow) closes: what it did not report goes into the ledger from how it ended (its results
  when it completed, else failed), and a job whose trajectories keep failing for one reason gives up.
- A run that continued as new does not see the units it carried close: it asks the control worker
  (`describe_children`) until each has reported.
- Every `training.stall.check_every_s` the queues the job uses are described (`describe_queues`) and the stall
  bookkeeping kept; a stall past `fail_after_s` ends the job.
- Cancelling what is in flight, `CHILDREN_PER_TASK` at a time.
"""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from rollart.contracts.activities import ActivityName, DescribeQueuesInput, DescribeQueuesResult, QueueState
    from rollart.contracts.errors import ErrorType, failure_of
    from rollart.contracts.rollouts import ChildOutcome, DescribeChildrenInput, DescribeChildrenResult
    from rollart.contracts.training import TrainingInput, TrainingPlan, TrainingState
    from rollart.spec.pools import Pool, queue_name
    from rollart.workflows import policies, stalls
    from rollart.workflows.training import loop

__all__ = ["CHILDREN_PER_CHECK", "CHILDREN_PER_TASK", "Watching"]

CHILDREN_PER_CHECK = 500
"""Units asked about in one `describe_children` call (its input stays well under Temporal's payload limits)."""

CHILDREN_PER_TASK = 500
"""Child workflows started (or cancelled) in one workflow task: its commands stay well under the 4 MB a task may
carry, whatever a launch or the end of a job holds."""


class Watching:
    """The training workflow's watchers (a mixin: the state is the workflow's)."""

    inp: TrainingInput
    plan: TrainingPlan
    s: TrainingState
    book: loop.Ledger
    finishing: bool
    fatal: ApplicationError | None
    parked: bool
    carried: set[str]

    async def _watch_child(self, workflow_id: str, handle: workflow.ChildWorkflowHandle) -> None:
        """A unit this run started, until it closes: what it did not report is taken from how it ended."""
        try:
            value = await handle
        except ChildWorkflowError as err:
            error, error_type = failure_of(err)
            self._closed(ChildOutcome(workflow_id=workflow_id, status="failed", error=error, error_type=error_type))
            return
        values = value if isinstance(value, list) else [] if value is None else [value]  # None: it reported
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
