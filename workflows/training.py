"""TrainingWorkflow: keeps trajectories in flight, trains on finished ones under the async bound.

- Admission: at most (bound + 1) × batch trajectories in flight plus buffered.
  Trajectories start as child workflows (parent-close: abandon) and report back
  by signal, so nothing is lost across continue-as-new (the id is stable).
- A batch is built from complete GRPO groups in completion order; a group is
  admissible at step k only if k − (oldest policy version any member used) ≤
  bound, else it is dropped and counted. Failed (infra) members are masked.
  With `dynamic_sampling`, a group whose rewards are all equal is filtered
  (counted) as it completes, and its slots refill.
- `trajectory` mode runs every episode on its own; `batch` mode runs a whole
  batch in lockstep (the synchronous baseline), with the same accounting.
- The job ends at `training.steps`, on the `stop` signal, or, with `training.stop_when`,
  once each step's success has held long enough (workflows/stopping.py).
"""

from __future__ import annotations

import asyncio
import random
import statistics
from collections.abc import Awaitable

from temporalio import workflow
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from rollart.contracts.activities import (
        ActivityName,
        DescribeQueuesInput,
        DescribeQueuesResult,
        QueueState,
        SampleRef,
        TrainStepInput,
        TrainStepResult,
    )
    from rollart.contracts.rollouts import (
        BatchRolloutInput,
        GroupRolloutInput,
        GroupSeed,
        TrajectoryInput,
        TrajectoryResult,
        batch_member_id,
        member_id,
    )
    from rollart.contracts.training import (
        HISTORY_KEPT,
        EndedBy,
        InFlight,
        StepRecord,
        TrainingInput,
        TrainingPlan,
        TrainingResult,
        TrainingState,
        TrainingStatus,
    )
    from rollart.infra import search_attributes as sa
    from rollart.infra.config import TaskSpec
    from rollart.infra.pools import Pool, queue_name
    from rollart.workflows import entropy_control, policies, stalls, stopping
    from rollart.workflows.batch_rollout import BatchRolloutWorkflow
    from rollart.workflows.group_rollout import GroupRolloutWorkflow
    from rollart.workflows.reporting import TRAJECTORIES_DONE
    from rollart.workflows.trajectory import TrajectoryWorkflow
    from rollart.workflows.ui_summary import batch_summary, group_summary, trajectory_summary

__all__ = ["TrainingWorkflow"]

TRAIN_STEP_TIMEOUT = policies.TRAIN_STEP.start_to_close


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
        self.watching = False  # stall checks run beside the loop (runs started since the "stall-detection" patch)

    # ------------------------------------------------------------ control surface

    @workflow.signal(name=TRAJECTORIES_DONE)
    def trajectories_done(self, results: list[TrajectoryResult]) -> None:
        """Finished trajectories report here; one not in flight (a duplicate) is ignored and counted.

        Once the job is finishing, reports are left alone: what was in flight when the last step
        ended is counted as cancelled, not as failed, whatever its cancellation reports.
        """
        if self.finishing:
            return
        if self.watching and any(r.trajectory_id in self.s.in_flight for r in results):
            self.s.stall = stalls.progressed(self.s.stall, workflow.now().timestamp(), finished=True)
        for r in results:
            running = self.s.in_flight.pop(r.trajectory_id, None)
            if running is None:
                self.s.duplicates_ignored += 1
                continue
            group = running.group
            self.s.restores += r.restores
            if r.status == "completed" and r.reward is not None and r.policy_version_min is not None:
                self.s.buffer.append(_sample(r))
            else:
                self.s.failed += 1  # infra failure: masked out of training, never scored 0
            self.s.unfinished[group] -= 1
            if self.s.unfinished[group] == 0:
                del self.s.unfinished[group]
                if not self._filtered(group):
                    self.s.ready_groups.append(group)

    @workflow.signal
    def pause(self) -> None:
        """Stop launching trajectories (in-flight ones finish; training continues on what is buffered)."""
        self.s.paused = True

    @workflow.signal
    def resume(self) -> None:
        """Launch trajectories again."""
        self.s.paused = False

    @workflow.signal
    def stop(self) -> None:
        """Finish the current step, then end the job (in-flight trajectories are cancelled)."""
        self.s.stop_requested = True

    @workflow.query
    def status(self) -> TrainingStatus:
        """Where the loop is, and every term of the trajectory ledger."""
        t = self.plan.training
        return TrainingStatus(
            job_id=self.inp.job_id,
            step=self.s.step,
            steps=t.steps,
            version=self.s.step,
            async_bound=t.async_bound,
            rollout_mode=t.rollout_mode,
            started=self.s.started,
            trained=self.s.trained,
            dropped=self.s.dropped,
            failed=self.s.failed,
            in_flight=len(self.s.in_flight),
            buffered=len(self.s.buffer),
            filtered=self.s.filtered,
            paused=self.s.paused,
            stopping=self.s.stop_requested,
            done=self.done,
            ledger_balanced=self.s.ledger_balanced,
            history=self.s.history,
            started_at=self.s.started_at,
            restores=self.s.restores,
            duplicates_ignored=self.s.duplicates_ignored,
            stalls=self.s.stall.stalls,
            stop_when=t.stop_when,
            stop_held=self.s.stop_held,
            ended_by=self.s.ended_by,
        )

    # ------------------------------------------------------------ the loop

    @workflow.run
    async def run(self, inp: TrainingInput) -> TrainingResult:
        """The loop, watched for stalls beside it (newer runs): a stall past `fail_after_s` ends the job."""
        if inp.state is None:
            self.s.started_at = workflow.now().timestamp()
        if not (self.plan.training.stall.enabled and workflow.patched("stall-detection")):
            return await self._loop(inp)
        self.watching = True
        watcher = asyncio.create_task(self._watch_stalls())
        loop = asyncio.create_task(self._loop(inp))
        await workflow.wait_condition(lambda: loop.done() or self.fatal is not None or self._stalled_history_full())
        watcher.cancel()
        await workflow.wait([watcher])  # its cancellation lands before the run's last command, not after it
        if not loop.done() and self.fatal is not None:
            loop.cancel()
            self.finishing = True
            await self._cancel_in_flight()
            raise self.fatal
        if not loop.done():  # stalled long, parked between launches: a fresh history, the same state
            loop.cancel()
            await workflow.wait_condition(workflow.all_handlers_finished)
            workflow.continue_as_new(
                TrainingInput(plan=self.plan, job_id=inp.job_id, run_dir=inp.run_dir, state=self.s)
            )
        return loop.result()

    async def _loop(self, inp: TrainingInput) -> TrainingResult:
        """Launch, wait, train, continue-as-new now and then; the job's result at the end."""
        t = self.plan.training
        steps_this_run = 0
        # Wake up for stale ready groups too: when they fill the buffer, nothing else would ever wake the loop.
        wake_on_stale = workflow.patched("wake-on-stale-groups")
        while self.s.step < t.steps and not self.s.stop_requested and self.s.ended_by is None:
            await self._launch()
            self.parked = True  # between launches and steps: the state is whole (a stalled run may continue-as-new)
            await workflow.wait_condition(
                lambda: (
                    self._batch_ready()
                    or self._can_launch()
                    or self._stalled()
                    or self.s.stop_requested
                    or (wake_on_stale and self._stale_ready())
                )
            )
            self.parked = False
            self._drop_stale()
            if self._batch_ready() or self._stalled():
                await self._train_step()
                steps_this_run += 1
                ending = self.s.step >= t.steps or self.s.ended_by is not None
                if steps_this_run >= t.continue_as_new_every and not ending:
                    await workflow.wait_condition(workflow.all_handlers_finished)
                    workflow.continue_as_new(
                        TrainingInput(plan=self.plan, job_id=inp.job_id, run_dir=inp.run_dir, state=self.s)
                    )
        return await self._finish()

    def _capacity(self) -> int:
        return self.plan.training.in_flight_limit

    def _next_launch_size(self) -> int:
        if self.plan.training.rollout_mode == "batch":
            return self.plan.training.batch_size
        return self._next_task().group_size

    def _can_launch(self) -> bool:
        if self.s.paused or self.s.stop_requested:
            return False
        occupied = len(self.s.in_flight) + len(self.s.buffer)
        return occupied + self._next_launch_size() <= self._capacity()

    def _next_task(self) -> TaskSpec:
        """Tasks drawn by weight, reproducibly: group g's task depends only on (seed, g)."""
        plan = self.plan
        rng = random.Random(plan.training.seed * 1_000_003 + self.s.next_group)
        return rng.choices(plan.tasks, weights=[task.weight for task in plan.tasks])[0]

    async def _launch(self) -> None:
        """Start as many groups (or lockstep batches) as admission allows, all in one workflow task.

        Multi-turn groups run a TrajectoryWorkflow per member (trajectory mode), or, with
        `rollout_unit: group`, play inside a GroupRolloutWorkflow; in batch mode per-episode tasks join
        one lockstep BatchRolloutWorkflow per batch, and grouped ones play their groups phase by phase
        (`lockstep`). The grouped groups of a task launched together share one GroupRolloutWorkflow
        (single-turn: one `prompts`, `generate_batch`, `check` and `reward_batch` call for all; multi-turn: each
        group plays on its own and reports when done, or phase by phase with the others in batch mode).
        """
        starts: list[Awaitable[object]] = []
        grouped: dict[str, tuple[str, list[tuple[str, TaskSpec, int]]]] = {}  # task → (workflow id, its groups)
        batch_mode = self.plan.training.rollout_mode == "batch"
        while self._can_launch():
            wave: list[tuple[str, TaskSpec, int]] = []
            target = self.plan.training.batch_size if batch_mode else 1
            while sum(task.group_size for _, task, _ in wave) < target or not wave:
                wave.append(self._new_group())
            # batch mode: grouped multi-turn tasks play as lockstep groups (older runs: in the per-episode batch)
            grouped_batch = batch_mode and workflow.patched("batch-lockstep-groups")
            episodes = [
                (g, t, seed)
                for g, t, seed in wave
                if t.max_turns > 1 and (not t.grouped or (batch_mode and not grouped_batch))
            ]
            if batch_mode and episodes:
                starts.append(self._start_batch(episodes))
            else:
                for g, t, seed in episodes:
                    starts += self._start_trajectories(g, t, seed)
            for g, t, seed in wave:
                if (g, t, seed) not in episodes:
                    wid, groups = grouped.setdefault(t.name, (f"{g}-w", []))
                    groups.append((g, t, seed))
                    for m in range(t.group_size):  # tracked now: admission must see them
                        self._track(member_id(g, m), g, wid)
        starts += [self._start_groups(wid, groups) for wid, groups in grouped.values()]
        if starts:
            await asyncio.gather(*starts)

    def _new_group(self) -> tuple[str, TaskSpec, int]:
        task = self._next_task()
        group_id = f"{self.inp.job_id}-g{self.s.next_group:06d}"
        seed = self.plan.training.seed * 1_000_003 + self.s.next_group
        self.s.next_group += 1
        self.s.unfinished[group_id] = task.group_size
        return group_id, task, seed

    def _track(self, trajectory_id: str, group_id: str, workflow_id: str) -> None:
        self.s.in_flight[trajectory_id] = InFlight(group=group_id, workflow=workflow_id)
        self.s.started += 1

    def _trajectory_input(self, task: TaskSpec, seed: int, group_id: str) -> TrajectoryInput:
        return TrajectoryInput(
            task=task,
            seed=seed,
            job_id=self.inp.job_id,
            group_id=group_id,
            min_version=self.s.step,
            report_to=workflow.info().workflow_id,
            queue_prefix=self.plan.queue_prefix,
        )

    def _queue(self, pool: Pool) -> str:
        return queue_name(pool, self.plan.queue_prefix)

    def _start_trajectories(self, group_id: str, task: TaskSpec, seed: int) -> list[Awaitable[object]]:
        starts = []
        for m in range(task.group_size):
            tid = member_id(group_id, m)
            self._track(tid, group_id, tid)
            inp = self._trajectory_input(task, seed, group_id)
            starts.append(
                workflow.start_child_workflow(
                    TrajectoryWorkflow.run,
                    inp,
                    id=tid,
                    task_queue=self._queue(Pool.CONTROL),
                    parent_close_policy=workflow.ParentClosePolicy.ABANDON,
                    search_attributes=self._child_attributes(task),
                    static_summary=trajectory_summary(inp, member=m, version=self.s.step),
                )
            )
        return starts

    def _start_groups(self, wid: str, groups: list[tuple[str, TaskSpec, int]]) -> Awaitable[object]:
        task = groups[0][1]
        inp = GroupRolloutInput(
            task=task,
            job_id=self.inp.job_id,
            min_version=self.s.step,
            report_to=workflow.info().workflow_id,
            groups=[
                GroupSeed(group_id=g, seed=seed, member_ids=[member_id(g, m) for m in range(t.group_size)])
                for g, t, seed in groups
            ],
            queue_prefix=self.plan.queue_prefix,
            lockstep=self.plan.training.rollout_mode == "batch",
        )
        return workflow.start_child_workflow(
            GroupRolloutWorkflow.run,
            inp,
            id=wid,
            task_queue=self._queue(Pool.CONTROL),
            parent_close_policy=workflow.ParentClosePolicy.ABANDON,
            search_attributes=self._child_attributes(task),
            static_summary=group_summary(inp, version=self.s.step),
        )

    def _start_batch(self, groups: list[tuple[str, TaskSpec, int]]) -> Awaitable[object]:
        batch_id = f"{groups[0][0]}-b"
        members = [(g, t, seed) for g, t, seed in groups for _ in range(t.group_size)]
        trajectories = [
            self._trajectory_input(t, seed, g).model_copy(update={"trajectory_id": batch_member_id(batch_id, i)})
            for i, (g, t, seed) in enumerate(members)
        ]
        for t in trajectories:
            self._track(t.trajectory_id, t.group_id, batch_id)
        inp = BatchRolloutInput(trajectories=trajectories, report_to=workflow.info().workflow_id)
        return workflow.start_child_workflow(
            BatchRolloutWorkflow.run,
            inp,
            id=batch_id,
            task_queue=self._queue(Pool.CONTROL),
            parent_close_policy=workflow.ParentClosePolicy.ABANDON,
            search_attributes=self._child_attributes(trajectories[0].task),
            static_summary=batch_summary(inp, version=self.s.step),
        )

    def _child_attributes(self, task: TaskSpec) -> TypedSearchAttributes:
        return TypedSearchAttributes(
            [
                SearchAttributePair(sa.JOB_ID, self.inp.job_id),
                SearchAttributePair(sa.TASK, task.name),
                SearchAttributePair(sa.POLICY_VERSION, self.s.step),
            ]
        )

    # ------------------------------------------------------------ batches

    def _filtered(self, group_id: str) -> bool:
        """Dynamic sampling: a complete group whose rewards are all equal has no GRPO signal. Leave it out
        and count it, unless so many were left out since the last step that the job would stop moving."""
        ds = self.plan.training.dynamic_sampling
        members = [x for x in self.s.buffer if x.group_id == group_id]
        if not ds.enabled or not members:
            return False
        if next(t.group_size for t in self.plan.tasks if t.name == members[0].task) < 2:
            return False  # a group of one is its own baseline: GRPO never gave it a signal to filter on
        rewards = [x.reward for x in members]
        if max(rewards) - min(rewards) > 1e-9:
            return False
        if self.s.filtered_since_step >= ds.max_filtered_batches * self.plan.training.batch_size:
            return False
        self.s.buffer = [x for x in self.s.buffer if x.group_id != group_id]
        self.s.filtered += len(members)
        self.s.filtered_since_step += len(members)
        self.s.filtered_successes_since_step += sum(x.success for x in members)
        return True

    def _is_stale(self, group_id: str) -> bool:
        bound = self.plan.training.async_bound
        return any(self.s.step - x.policy_version_min > bound for x in self.s.buffer if x.group_id == group_id)

    def _stale_ready(self) -> bool:
        return any(self._is_stale(g) for g in self.s.ready_groups)

    def _drop_stale(self) -> None:
        """Ready groups too old for the current step can never become admissible: drop and count them."""
        for group in [g for g in self.s.ready_groups if self._is_stale(g)]:
            members = [x for x in self.s.buffer if x.group_id == group]
            self.s.dropped += len(members)
            self.s.buffer = [x for x in self.s.buffer if x.group_id != group]
            self.s.ready_groups.remove(group)

    def _batch_ready(self) -> bool:
        ready = {g for g in self.s.ready_groups if not self._is_stale(g)}
        return sum(1 for x in self.s.buffer if x.group_id in ready) >= self.plan.training.batch_size

    def _stalled(self) -> bool:
        """Nothing in flight, no room to launch, a partial batch ready (failures shrank it): train on that."""
        ready = any(not self._is_stale(g) for g in self.s.ready_groups)
        return ready and not self.s.in_flight and not self._can_launch() and not self.s.paused

    def _take_batch(self) -> list[SampleRef]:
        batch: list[SampleRef] = []
        size = self.plan.training.batch_size
        while len(batch) < size and self.s.ready_groups:
            group = self.s.ready_groups.pop(0)
            batch += [x for x in self.s.buffer if x.group_id == group]
            self.s.buffer = [x for x in self.s.buffer if x.group_id != group]
        return batch

    async def _train_step(self) -> None:
        inp = self.inp
        batch = self._take_batch()
        step = self.s.step
        trainer = entropy_control.trainer_for_step(self.plan.trainer, self.s.entropy_coef)
        result: TrainStepResult = await workflow.execute_activity(
            ActivityName.TRAIN_STEP.value,
            TrainStepInput(
                job_id=inp.job_id,
                step=step,
                samples=batch,
                model_dir=self.plan.model_dir,
                run_dir=inp.run_dir,
                trainer=trainer,
            ),
            task_queue=self._queue(Pool.TRAINER),
            result_type=TrainStepResult,
            **policies.TRAIN_STEP.kwargs(),
        )
        self.s.step = result.version
        self.s.trained += len(batch)
        if trainer.loss.entropy_target is not None:
            entropy = result.metrics.get(entropy_control.measured(trainer.loss))
            self.s.entropy_coef = entropy_control.next_coef(trainer.loss, trainer.loss.entropy_coef, entropy)
        if self.watching:
            self.s.stall = stalls.progressed(self.s.stall, workflow.now().timestamp(), finished=False)
        record = self._record(step, batch, result)
        self.s.history = [*self.s.history, record][-HISTORY_KEPT:]
        self.s.filtered_since_step = self.s.filtered_successes_since_step = 0
        self._judge_learned(record)
        workflow.upsert_search_attributes([sa.STEP.value_set(self.s.step), sa.POLICY_VERSION.value_set(self.s.step)])

    def _record(self, step: int, batch: list[SampleRef], result: TrainStepResult) -> StepRecord:
        by_task: dict[str, list[bool]] = {}
        for x in batch:
            by_task.setdefault(x.task, []).append(x.success)
        staleness = [step - x.policy_version_min for x in batch]
        sampled = len(batch) + self.s.filtered_since_step  # what the policy played for this step, filtered or not
        return StepRecord(
            step=step,
            version=result.version,
            time=workflow.now().timestamp(),
            samples=len(batch),
            reward_mean=statistics.fmean(x.reward for x in batch),
            success_rate=statistics.fmean(float(x.success) for x in batch),
            success_sampled=(sum(x.success for x in batch) + self.s.filtered_successes_since_step) / sampled,
            task_success={k: statistics.fmean(map(float, v)) for k, v in by_task.items()},
            staleness_mean=statistics.fmean(staleness),
            staleness_max=max(staleness),
            completion_tokens=sum(x.completion_tokens for x in batch),
            started=self.s.started,
            trained=self.s.trained,
            dropped=self.s.dropped,
            failed=self.s.failed,
            in_flight=len(self.s.in_flight),
            buffered=len(self.s.buffer),
            filtered=self.s.filtered,
            train=result.metrics,
        )

    def _judge_learned(self, record: StepRecord) -> None:
        """`training.stop_when`: count the steps its success has held; once long enough, the loop ends (before
        the cap: at the cap the job ends by its steps anyway). Without a rule nothing changes."""
        rule = self.plan.training.stop_when
        if rule is None:
            return
        self.s.stop_held = stopping.held(rule, self.s.stop_held, record.played_success)
        if stopping.should_stop(rule, self.s.stop_held) and self.s.step < self.plan.training.steps:
            self.s.ended_by = "stop_when"
            workflow.logger.info(
                "job %s learned: %s, ending at step %d of %d",
                self.inp.job_id,
                rule.describe(),
                self.s.step,
                self.plan.training.steps,
            )

    def _ended_by(self) -> EndedBy:
        """Why the loop ended: its stop rule held, it trained all its steps, or it was sent `stop`."""
        if self.s.ended_by is not None:
            return self.s.ended_by
        return "steps" if self.s.step >= self.plan.training.steps else "stop_signal"

    async def _finish(self) -> TrainingResult:
        """Cancel what is still in flight (it can no longer be trained on) and report the ledger."""
        self.finishing = True
        await self._cancel_in_flight()
        if self.s.stall.open:  # a job that ends is stalled no more
            self.s.stall = self.s.stall.model_copy(update={"open": []})
            workflow.set_current_details("")
        self.s.ended_by = self._ended_by()
        self.done = True
        t = self.plan.training
        return TrainingResult(
            job_id=self.inp.job_id,
            steps=self.s.step,
            version=self.s.step,
            started=self.s.started,
            trained=self.s.trained,
            dropped=self.s.dropped,
            failed=self.s.failed,
            cancelled_in_flight=len(self.s.in_flight),
            buffered_unused=len(self.s.buffer),
            last=self.s.history[-1] if self.s.history else None,
            filtered=self.s.filtered,
            ended_by=self.s.ended_by,
            max_steps=t.steps,
            stop_when=t.stop_when,
        )

    async def _cancel_in_flight(self) -> None:
        """Cancel the workflows of the trajectories still in flight (their results can no longer be used)."""
        for wid in sorted(set(self._in_flight_workflows())):
            try:
                await workflow.get_external_workflow_handle(wid).cancel()
            except Exception as err:  # already finished between its signal and now
                workflow.logger.info("cancel of %s skipped: %s", wid, err)

    # ------------------------------------------------------------ stalls

    async def _watch_stalls(self) -> None:
        """Every `check_every_s`: describe the job's queues (one small activity) and keep the stall bookkeeping."""
        cfg = self.plan.training.stall
        pools = stalls.watched_pools(self.plan.tasks)
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
            self.fatal = ApplicationError(
                f"job {self.inp.job_id} stalled: {over.describe()}; gave up after training.stall.fail_after_s = "
                f"{cfg.fail_after_s:g} s (start a worker for the pool, or raise or unset fail_after_s)",
                {"reason": over.reason, "pool": over.pool, "since": over.since},
                type="JobStalled",
                non_retryable=True,
            )

    def _in_flight_workflows(self) -> list[str]:
        """Workflow ids behind the in-flight trajectories (a lockstep batch or a group wave is one workflow)."""
        return [x.workflow for x in self.s.in_flight.values()]


def _sample(r: TrajectoryResult) -> SampleRef:
    return SampleRef(
        trajectory_id=r.trajectory_id,
        task=r.task,
        group_id=r.group_id,
        reward=r.reward or 0.0,
        success=bool(r.success),
        turn_keys=r.turn_keys,
        policy_version_min=r.policy_version_min or 0,
        policy_version_max=r.policy_version_max or 0,
        completion_tokens=r.completion_tokens,
        completion_index=r.completion_index,
    )
