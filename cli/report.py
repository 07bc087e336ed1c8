"""`rollart report RUN_DIR`: the run's report.html (curves, ledger, timeline, sample trajectories), on demand."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from rollart.cli.errors import UserError
from rollart.cli.show import add_reader_args, reader_ui
from rollart.cli.spec import load_spec

if TYPE_CHECKING:
    from temporalio.client import Client

    from rollart.client.report import ReportData
    from rollart.contracts.training import TrainingResult
    from rollart.infra.store.payload import Store
    from rollart.spec.config import JobSpec

__all__ = ["add_parser", "build_report", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `report` and its flags."""
    s = sub.add_parser(
        "report",
        help="write a run's report.html: curves, ledger, pool timeline, best/worst/failed "
        "trajectories turn by turn; one self-contained page",
    )
    s.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a `rollart train` run dir (holds metrics.jsonl)")
    s.add_argument("--out", type=Path, help="the page to write (default: RUN_DIR/report.html)")
    s.add_argument(
        "--job-id", help="the job whose trajectories to show (default: the run dir's name, as `rollart train` names it)"
    )
    s.add_argument(
        "--samples",
        type=int,
        default=3,
        metavar="N",
        help="best, worst and failed trajectories shown per task, N of each (default 3; 0: none)",
    )
    s.add_argument(
        "--scan",
        type=int,
        default=1000,
        metavar="N",
        help="read the job's newest N rollout workflows to pick them from (default 1000)",
    )
    s.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="give up on the server after S seconds and write the page without trajectories (default 120)",
    )
    add_reader_args(s)
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Write the page; a server that cannot be reached only leaves the trajectories out (the page says why)."""
    if not args.run_dir.is_dir():
        raise UserError(f"{args.run_dir} is not a directory: give a `rollart train` run dir (runs/JOB_ID)")
    for flag in ("samples", "scan"):
        if getattr(args, flag) < 0:
            raise UserError(f"--{flag} must be at least 0, got {getattr(args, flag)}")
    job = load_spec(args.job, args)
    run_dir = args.run_dir.resolve()
    job_id = args.job_id or run_dir.name
    data = asyncio.run(
        build_report(
            job, job_id, run_dir, ui=reader_ui(job, args), per_task=args.samples, scan=args.scan, timeout_s=args.timeout
        )
    )
    from rollart.client.report import write_report

    path = write_report(data, args.out)
    if data.note:
        print(f"note: {data.note}")
    shown = sum(len(t.best) + len(t.worst) + len(t.failed) for t in data.samples)
    print(f"wrote {path}: {len(data.metrics)} steps, {shown} trajectories of {len(data.samples)} task(s)")
    return 0


async def build_report(
    job: JobSpec,
    job_id: str,
    run_dir: Path,
    *,
    client: Client | None = None,
    result: TrainingResult | None = None,
    ui: str | None = None,
    note: str | None = None,
    per_task: int = 3,
    scan: int = 1000,
    timeout_s: float = 120.0,
) -> ReportData:
    """The report's data: the run dir, and the job's server and store (connected here unless `client` is given).

    Shared by `rollart report` and the end of `rollart train`; a `note` (say, why the client failed) skips the server.
    """
    from rollart.client.report import gather_report
    from rollart.infra.temporal.connection import connect

    async def connected() -> Client:
        return client or await connect(job.temporal, job.store)

    if per_task == 0 and note is None:
        note = "no trajectories asked for (--samples 0)"
    store = _store(job) if note is None else None
    return await gather_report(
        run_dir,
        job_id,
        connected,
        store,
        result=result,
        per_task=per_task,
        scan=scan,
        timeout_s=timeout_s,
        note=note,
        ui=ui,
        namespace=job.temporal.namespace,
    )


def _store(job: JobSpec) -> Store | None:
    """The job's store for token counts and logprobs; None when it cannot be opened (turns are shown without)."""
    from rollart.infra.store.payload import StoreError, open_store

    try:
        return open_store(job.store)
    except (StoreError, OSError, RuntimeError):  # a Mooncake master that is gone: the histories hold the transcripts
        return None
