"""A run report: `runs/<id>/report.html`, one self-contained page of a training run's curves, ledger and trajectories.

Gathered from the run dir (metrics.jsonl, timeline.jsonl), the job's final result when the server still has it, and
a sample of the job's trajectories (the best, worst and failed per task, each turn by turn, read as `rollart show`
reads them); rendered by `report_html.render_report` into a page that loads nothing from the network, so it can be
mailed, archived or opened on a machine without access to the cluster. Temporal or a store that cannot be reached
costs only the trajectories: the page says why they are missing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rollart.client.job_trajectories import TrajectoryRow, list_trajectories, pick_rows
from rollart.client.plot import read_jsonl
from rollart.client.trajectory_loader import TrajectoryNotFound, load_trajectory
from rollart.client.trajectory_view import TrajectoryView

if TYPE_CHECKING:
    from temporalio.client import Client

    from rollart.contracts.training import TrainingResult
    from rollart.infra.store.payload import Store

__all__ = [
    "Ledger",
    "ReportData",
    "Sample",
    "TaskSamples",
    "final_result",
    "gather_report",
    "ledger_of",
    "sample_trajectories",
    "write_report",
]

log = logging.getLogger(__name__)

REPORT_FILE = "report.html"


@dataclass(frozen=True)
class Ledger:
    """Where every started trajectory went: started = trained + dropped + filtered + failed + in flight + buffered."""

    started: int
    trained: int
    dropped: int
    filtered: int
    failed: int
    in_flight: int
    buffered: int
    source: str  # where the counts come from: the job's result, or the last step record
    final: bool = False  # from the job's result: in flight = cancelled when it ended, buffered = never trained on

    @property
    def accounted(self) -> int:
        return self.trained + self.dropped + self.filtered + self.failed + self.in_flight + self.buffered

    @property
    def balanced(self) -> bool:
        return self.accounted == self.started


@dataclass(frozen=True)
class Sample:
    """One trajectory of the sample: its row (always), its turns when they could be read, else why not."""

    row: TrajectoryRow
    view: TrajectoryView | None = None
    note: str | None = None


@dataclass(frozen=True)
class TaskSamples:
    """A task's picks: the highest and lowest rewards and the trajectories that failed, of `scanned` of its own."""

    task: str
    scanned: int
    statuses: dict[str, int] = field(default_factory=dict)  # of the scanned: completed, failed, cancelled, running
    best: list[Sample] = field(default_factory=list)
    worst: list[Sample] = field(default_factory=list)
    failed: list[Sample] = field(default_factory=list)


@dataclass(frozen=True)
class ReportData:
    """Everything the page shows; `note` says why trajectories are missing or partial (None: all there)."""

    job_id: str
    run_dir: Path
    metrics: list[dict]
    timeline: list[dict]
    ledger: Ledger | None
    samples: list[TaskSamples]
    note: str | None = None
    ui: str | None = None  # Temporal UI base URL, printed (never linked: the page loads nothing)
    namespace: str = "default"
    created: float = field(default_factory=time.time)


def ledger_of(metrics: list[dict], result: TrainingResult | None = None) -> Ledger | None:
    """The job's final counts when its result is known, else the last step record's; None with neither."""
    if result is not None:
        end = f"; {note}" if (note := result.end_note()) else ""  # a stop rule that held, or the stop signal
        return Ledger(
            started=result.started,
            trained=result.trained,
            dropped=result.dropped,
            filtered=result.filtered,
            failed=result.failed,
            in_flight=result.cancelled_in_flight,
            buffered=result.buffered_unused,
            source=f"the job's result (policy v{result.version} after {result.steps} steps{end})",
            final=True,
        )
    if not metrics:
        return None
    last = metrics[-1]
    return Ledger(
        started=last.get("started", 0),
        trained=last.get("trained", 0),
        dropped=last.get("dropped", 0),
        filtered=last.get("filtered", 0),
        failed=last.get("failed", 0),
        in_flight=last.get("in_flight", 0),
        buffered=last.get("buffered", 0),
        source=f"the last step record (step {last.get('step', '?')})",
    )


async def final_result(client: Client, job_id: str) -> TrainingResult | None:
    """The training workflow's result when it completed (read from history: no worker needed); None otherwise."""
    from temporalio.client import WorkflowExecutionStatus

    from rollart.contracts.training import TrainingResult

    handle = client.get_workflow_handle(job_id, result_type=TrainingResult)
    desc = await handle.describe()
    if desc.workflow_type != "TrainingWorkflow" or desc.status != WorkflowExecutionStatus.COMPLETED:
        return None
    return await handle.result()


async def sample_trajectories(
    client: Client, job_id: str, store: Store | None, per_task: int = 3, scan: int = 1000, concurrency: int = 8
) -> list[TaskSamples]:
    """Per task, the `per_task` best and worst rewards and failed trajectories, each loaded turn by turn.

    Only the job's newest `scan` rollout workflows are read (visibility lists the newest first): a long run has
    tens of thousands of trajectories, and the report wants what the policy did lately, not every one.
    """
    rows = await list_trajectories(client, job_id, limit=scan)
    picks = [_pick(rows, task, per_task) for task in sorted({r.task for r in rows})]
    wanted = {s.row.trajectory_id: s.row for p in picks for s in (*p.best, *p.worst, *p.failed)}
    gate = asyncio.Semaphore(concurrency)

    async def load(row: TrajectoryRow) -> Sample:
        async with gate:
            return await _load_sample(client, row, store)

    loaded = dict(zip(wanted, await asyncio.gather(*(load(r) for r in wanted.values()))))
    return [
        dataclasses.replace(
            p,
            best=[loaded[s.row.trajectory_id] for s in p.best],
            worst=[loaded[s.row.trajectory_id] for s in p.worst],
            failed=[loaded[s.row.trajectory_id] for s in p.failed],
        )
        for p in picks
    ]


def _pick(rows: list[TrajectoryRow], task: str, n: int) -> TaskSamples:
    """A task's rows to show: best and worst by reward (the worst never repeat a best), and the failed ones."""
    best = pick_rows(rows, task=task, best=n)
    shown = {r.trajectory_id for r in best}
    worst = [r for r in pick_rows(rows, task=task, worst=n + len(best)) if r.trajectory_id not in shown][:n]
    failed = [r for r in pick_rows(rows, task=task, failed=True) if r.status == "failed"][
        :n
    ]  # not cancelled at the end
    statuses = Counter(r.status for r in rows if r.task == task)
    return TaskSamples(
        task=task,
        scanned=sum(statuses.values()),
        statuses=dict(sorted(statuses.items())),
        best=[Sample(r) for r in best],
        worst=[Sample(r) for r in worst],
        failed=[Sample(r) for r in failed],
    )


async def _load_sample(client: Client, row: TrajectoryRow, store: Store | None) -> Sample:
    """The row with its turns; a trajectory that cannot be read (a whole group workflow that failed has no
    member to show) keeps its row and says why."""
    try:
        return Sample(row, await load_trajectory(client, row.trajectory_id, store))
    except TrajectoryNotFound:
        return Sample(row, note=f"no turns recorded for {row.trajectory_id} (its workflow: {row.workflow_id})")
    except Exception as e:  # one unreadable history must not cost the report the others
        log.warning("report: cannot read trajectory %s: %s", row.trajectory_id, e)
        return Sample(row, note=f"its history could not be read: {type(e).__name__}: {e}")


async def gather_report(
    run_dir: Path,
    job_id: str,
    client: Client | Callable[[], Awaitable[Client]] | None = None,
    store: Store | None = None,
    *,
    result: TrainingResult | None = None,
    per_task: int = 3,
    scan: int = 1000,
    timeout_s: float = 120.0,
    note: str | None = None,
    ui: str | None = None,
    namespace: str = "default",
) -> ReportData:
    """The run dir's files, then what the server still holds (the job's result, its trajectories) within
    `timeout_s`. `client` may be a coroutine function that connects: a server that cannot be reached (or any
    failure reading it) leaves the report without trajectories and says why in `note`, never fails it."""
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    timeline = read_jsonl(run_dir / "timeline.jsonl")
    samples: list[TaskSamples] = []
    if client is not None and note is None:
        try:
            result, samples = await asyncio.wait_for(
                _from_server(client, job_id, store, result, per_task, scan), timeout_s
            )
            if not samples:
                note = f"no trajectories of job {job_id!r} on the server"
        except TimeoutError:
            note = f"trajectories could not be loaded: the server did not answer within {timeout_s:.0f} s"
        except Exception as e:  # unreachable server, unknown namespace, a store that is down: the curves still count
            log.debug("report: trajectories of %s not loaded", job_id, exc_info=True)
            note = f"trajectories could not be loaded: {e or type(e).__name__}"
    elif client is None and note is None:
        note = "trajectories not loaded: no Temporal server was given"
    return ReportData(
        job_id=job_id,
        run_dir=run_dir,
        metrics=metrics,
        timeline=timeline,
        ledger=ledger_of(metrics, result),
        samples=samples,
        note=note,
        ui=ui,
        namespace=namespace,
    )


async def _from_server(
    client: Client | Callable[[], Awaitable[Client]],
    job_id: str,
    store: Store | None,
    result: TrainingResult | None,
    per_task: int,
    scan: int,
) -> tuple[TrainingResult | None, list[TaskSamples]]:
    from temporalio.client import Client as _Client
    from temporalio.service import RPCError, RPCStatusCode

    c = client if isinstance(client, _Client) else await client()
    if result is None:
        try:
            result = await final_result(c, job_id)
        except RPCError as e:  # a `rollart rollout` job has no training workflow: its trajectories still show
            if e.status != RPCStatusCode.NOT_FOUND:
                raise
    return result, await sample_trajectories(c, job_id, store, per_task=per_task, scan=scan)


def write_report(data: ReportData, out: Path | None = None) -> Path:
    """The page at `out` (default: report.html in the run dir), written whole then renamed: never half a page."""
    from rollart.client.report_html import render_report

    out = out or data.run_dir / REPORT_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(render_report(data), encoding="utf-8")
    tmp.replace(out)
    return out
