"""`rollart trajectories`: a job's trajectories, one row each, to pick one for `rollart show`."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import TYPE_CHECKING

from rollart.cli.errors import UserError
from rollart.cli.show import add_reader_args, reader_ui
from rollart.cli.spec import load_spec

if TYPE_CHECKING:
    from rollart.client.job_trajectories import TrajectoryRow
    from rollart.spec.config import JobSpec

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `trajectories` and its flags."""
    s = sub.add_parser("trajectories", help="list a job's trajectories (task, status, reward, turns) to `show`")
    s.add_argument("job_id", help="the job id `rollart rollout` or `rollart train` printed")
    s.add_argument("--task", help="only this task's trajectories")
    s.add_argument("--failed", action="store_true", help="only trajectories that did not complete")
    picks = s.add_mutually_exclusive_group()
    picks.add_argument("--worst", type=int, metavar="N", help="the N lowest rewards")
    picks.add_argument("--best", type=int, metavar="N", help="the N highest rewards")
    s.add_argument("--json", action="store_true", help="print one JSON object per line")
    add_reader_args(s)
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the rows picked; none at all for the job (not only after filtering) is a UserError."""
    from rollart.client.job_trajectories import pick_rows

    for flag in ("worst", "best"):
        if (n := getattr(args, flag)) is not None and n < 1:
            raise UserError(f"--{flag} must be at least 1, got {n}")
    job = load_spec(args.job, args)
    rows = asyncio.run(_rows(args, job))
    if not rows:
        raise UserError(
            f"no trajectories of job {args.job_id!r} on {job.temporal.address or 'the local server'} "
            f"(namespace {job.temporal.namespace!r})"
        )
    picked = pick_rows(rows, task=args.task, failed=args.failed, worst=args.worst, best=args.best)
    if args.json:
        import dataclasses

        for r in picked:
            print(json.dumps(dataclasses.asdict(r)))
        return 0
    print_rows(args.job_id, picked, len(rows), reader_ui(job, args), job.temporal.namespace)
    return 0


async def _rows(args: argparse.Namespace, job: JobSpec) -> list[TrajectoryRow]:
    from temporalio.service import RPCError

    from rollart.client.job_trajectories import list_trajectories
    from rollart.infra.temporal.connection import connect

    try:
        client = await connect(job.temporal, job.store)
        return await list_trajectories(client, args.job_id)
    except (ConnectionError, RPCError) as e:
        raise UserError(f"cannot list the trajectories of {args.job_id!r}: {e}") from e


def print_rows(job_id: str, rows: list[TrajectoryRow], total: int, ui: str, namespace: str) -> None:
    """A table of the rows, then how many of the job's trajectories they are."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from rollart.infra.temporal.connection import ui_url

    table = Table(title=f"job {job_id}")
    for col in ("trajectory", "task", "status", "reward", "success", "turns", "versions"):
        table.add_column(col, overflow="fold")
    table.add_column("Temporal UI", no_wrap=True)
    for r in rows:
        status = r.status if r.status in ("completed", "running") else f"[red]{r.status}[/red]: {escape(r.error or '')}"
        table.add_row(
            escape(r.trajectory_id),
            escape(r.task),
            status,
            f"{r.reward:.3f}" if r.reward is not None else "-",
            "-" if r.success is None else "yes" if r.success else "no",
            "-" if r.turns is None else str(r.turns),
            r.versions,
            ui_url(ui, namespace, r.workflow_id),
        )
    Console(width=max(170, Console().width)).print(table)
    print(f"{len(rows)} of {total} trajectories; `rollart show TRAJECTORY_ID` prints one turn by turn")
