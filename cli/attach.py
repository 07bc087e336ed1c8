"""`rollart attach`: follow a running training job as `rollart train` does, until it ends (or detach again)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from rollart.cli.errors import UserError
from rollart.cli.spec import add_temporal_security_args, load_spec

if TYPE_CHECKING:
    from rollart.spec.config import JobSpec

__all__ = ["add_parser", "attach_job", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `attach`; like `status`, its server defaults to 127.0.0.1:7233, never a local stack of its own."""
    s = sub.add_parser("attach", help="follow a running training job: progress bar, metrics.jsonl, the final summary")
    s.add_argument("job_id", help="the job id `rollart train` printed (= the TrainingWorkflow's id)")
    s.add_argument("--temporal-address", metavar="HOST:PORT", default="127.0.0.1:7233", help="Temporal server")
    s.add_argument("--namespace", default="default", help="Temporal namespace")
    add_temporal_security_args(s)
    s.add_argument(
        "--run-dir", type=Path, help="where metrics.jsonl and plots go (default: the run dir the job was started with)"
    )
    s.add_argument(
        "--store-path",
        type=Path,
        help="the job's local store, for payloads kept out of history (default .rollart/store)",
    )
    s.add_argument("--ui-url", help="Temporal UI base URL for links (default: http://HOST:8233)")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Follow the job with the connection settings of the flags."""
    return attach_job(load_spec(None, args), args.job_id, args.run_dir, args.ui_url)


def attach_job(job: JobSpec, job_id: str, run_dir: Path | None, ui_url: str | None) -> int:
    """Follow `job_id` on the job's server; Ctrl-C detaches (never stops the job)."""
    address = job.temporal.address or "127.0.0.1:7233"
    job = job.model_copy(update={"temporal": job.temporal.model_copy(update={"address": address})})
    return asyncio.run(_attach(job, job_id, run_dir, ui_url or f"http://{address.rsplit(':', 1)[0]}:8233"))


async def _attach(job: JobSpec, job_id: str, run_dir: Path | None, ui: str) -> int:
    from temporalio.service import RPCError

    from rollart.cli.train import follow_job
    from rollart.client.connection import Outage, connect_retrying, retry_unreachable
    from rollart.client.train import run_dir_of, status_of
    from rollart.contracts.training import TrainingResult

    outage = Outage()
    try:
        client = await connect_retrying(job.temporal, job.store, outage, give_up_after_s=60)
        handle = client.get_workflow_handle(job_id, result_type=TrainingResult)
        status = await retry_unreachable(lambda: status_of(handle), outage)
        run_dir = (run_dir or await run_dir_of(client, job_id)).resolve()
    except (ConnectionError, RPCError, ValueError) as e:
        raise UserError(f"cannot attach to job {job_id!r} on {job.temporal.address}: {e}") from e
    state = "done" if status.done else "running"
    print(f"job {job_id}: {state}, step {status.step}/{status.steps}; run dir {run_dir}")
    return await follow_job(client, handle, job, run_dir, ui, status.steps, stop_on_exit=False, local=False)
