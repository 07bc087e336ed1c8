"""`rollart train`: start a training job and follow it with a progress bar; metrics, checkpoints and plots."""

from __future__ import annotations

import argparse
import asyncio
import logging
import shlex
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rollart.cli.spec import add_temporal_args, check_components, load_spec
from rollart.cli.stack import add_stack_args, connect_client, server_for

if TYPE_CHECKING:
    from temporalio.client import Client, WorkflowHandle

    from rollart.client.train import MetricsWriter
    from rollart.contracts.training import TrainingResult
    from rollart.spec.config import JobSpec

__all__ = ["add_parser", "attach_command", "follow_job", "run", "write_run_report"]

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `train`; --steps, --async-bound and --rollout-mode override the job's `training` section."""
    s = sub.add_parser("train", help="train a policy: rollout and training overlapped under the async bound")
    s.add_argument("job", type=Path, nargs="?", help="job spec (YAML or JSON); optional with --attach")
    s.add_argument("--steps", type=int, help="train steps (default: the job's training.steps)")
    s.add_argument("--async-bound", type=int, help="max policy versions a trajectory may lag (0 = on-policy)")
    s.add_argument("--rollout-mode", choices=["trajectory", "batch"], help="trajectory (RollArt) or batch (lockstep)")
    s.add_argument("--run-dir", type=Path, help="where metrics.jsonl, checkpoints and plots go (default runs/JOB_ID)")
    s.add_argument("--attach", metavar="JOB_ID", help="follow a running job instead of starting one (= rollart attach)")
    s.add_argument(
        "--stop-on-exit",
        action="store_true",
        help="on a remote server, terminate the job when this command is interrupted or fails "
        "(default: detach and print how to re-attach; the local stack always stops its job)",
    )
    add_temporal_args(s)
    s.add_argument("--ui-url", help="Temporal UI base URL for links (default: http://HOST:8233)")
    add_stack_args(s)
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Train on the job's server, or on a local stack started for the run (and stopped after it)."""
    from rollart.cli.errors import UserError
    from rollart.client.rollout import new_job_id

    if args.attach:
        from rollart.cli.attach import attach_job

        return attach_job(load_spec(args.job, args), args.attach, args.run_dir, args.ui_url)
    if args.job is None:
        raise UserError("give a job spec to train (or --attach JOB_ID to follow a running job)")
    job = load_spec(args.job, args)
    check_components(job, args.job)
    job_id = new_job_id(job)
    run_dir = (args.run_dir or Path("runs") / job_id).resolve()
    with server_for(job, args, training=True) as server:
        stop = server.local or args.stop_on_exit
        return asyncio.run(_train(server.job, job_id, run_dir, server.ui, stop_on_exit=stop, local=server.local))


async def _train(job: JobSpec, job_id: str, run_dir: Path, ui: str, *, stop_on_exit: bool, local: bool) -> int:
    """Start and follow a job. Interrupted (or failing): with `stop_on_exit` (always on the local stack, whose
    workers go away with it) the job is terminated; otherwise it keeps running and the re-attach command is printed."""
    from rollart.cli.errors import UserError
    from rollart.client.exporters import ExporterUnavailable, check_installed
    from rollart.client.train import start_training

    try:
        check_installed(job.metrics)  # before the job starts, not when its first step is exported
    except ExporterUnavailable as e:
        raise UserError(str(e)) from e
    client = await connect_client(job)
    t = job.training
    handle = await start_training(client, job, job_id, run_dir)
    until = f" (or until {t.stop_when.describe()})" if t.stop_when else ""
    print(
        f"job {job_id}: {t.steps} steps{until}, batch {t.batch_size}, async bound {t.async_bound}, "
        f"{t.rollout_mode} rollout; run dir {run_dir}"
    )
    return await follow_job(client, handle, job, run_dir, ui, t.steps, stop_on_exit=stop_on_exit, local=local)


async def follow_job(
    client: Client,
    handle: WorkflowHandle,
    job: JobSpec,
    run_dir: Path,
    ui: str,
    steps: int,
    *,
    stop_on_exit: bool,
    local: bool,
) -> int:
    """Follow a started (or re-attached) job to its end and report; on Ctrl-C or a failure, stop or detach."""
    from rollart.cli.errors import UserError
    from rollart.client.exporters import ExporterUnavailable, open_exporters
    from rollart.client.train import MetricsWriter
    from rollart.infra.temporal.connection import ui_url

    job_id = handle.id
    if ui:
        print(f"Temporal UI: {ui_url(ui, job.temporal.namespace, job_id)}")
    try:
        writer = MetricsWriter(run_dir, open_exporters(job, job_id, run_dir))
    except ExporterUnavailable as e:
        raise UserError(str(e)) from e
    interrupted = _cancel_on_signals()
    try:
        result = await _follow_with_bar(client, handle, writer, steps)
    except asyncio.CancelledError:
        if not interrupted.is_set():
            raise
        await _leave(client, job, job_id, "interrupted", stop_on_exit=stop_on_exit, local=local)
        return 130
    except Exception as e:
        if is_workflow_failure(e):  # the job failed; its trajectories, on the server still, may tell why
            await write_run_report(client, job, job_id, run_dir, ui)
            raise
        await _leave(client, job, job_id, f"failed ({type(e).__name__}: {e})", stop_on_exit=stop_on_exit, local=local)
        await write_run_report(
            None, job, job_id, run_dir, ui, note=f"trajectories not loaded: the client failed ({type(e).__name__}: {e})"
        )
        raise
    finally:
        writer.close()
    await _report(client, job, job_id, run_dir, result, writer)
    await write_run_report(client, job, job_id, run_dir, ui, result=result)
    return 0


async def write_run_report(
    client: Client | None,
    job: JobSpec,
    job_id: str,
    run_dir: Path,
    ui: str,
    *,
    result: TrainingResult | None = None,
    note: str | None = None,
) -> Path | None:
    """`report.html` in the run dir, when there is anything to show (steps, or trajectories of a failed job).

    Never fails the command: the run is what matters, so a report that cannot be built is logged and skipped,
    and Ctrl-C while it is built skips only the report.
    """
    from rollart.cli.report import build_report
    from rollart.client.report import write_report

    try:
        data = await build_report(job, job_id, run_dir, client=client, result=result, ui=ui or None, note=note)
        if not data.metrics and not data.samples:
            return None
        path = write_report(data)
    except asyncio.CancelledError:
        if (task := asyncio.current_task()) is not None:
            task.uncancel()  # the interrupt was meant for the report alone: the run itself is over
        print("report: skipped (interrupted)", flush=True)
        return None
    except Exception as e:  # a broken report must never turn a finished run into a failed one
        log.warning("the run report could not be written", exc_info=True)
        print(f"report: not written ({type(e).__name__}: {e})", flush=True)
        return None
    print(f"report: {path}" + (f" ({data.note})" if data.note else ""), flush=True)
    return path


async def _leave(client: Client, job: JobSpec, job_id: str, why: str, *, stop_on_exit: bool, local: bool) -> None:
    """The client is going away: terminate the job if asked to, else say how to follow it again."""
    from rollart.client.train import terminate_job

    if stop_on_exit:
        try:
            n = await terminate_job(client, job_id, f"rollart train was {why}")
            print(
                f"{why}: terminated job {job_id} ({n} running workflows)"
                + ("; the local stack stops with this command" if local else ""),
                flush=True,
            )
        except Exception as e:  # the server may be the thing that failed
            print(f"{why}: could not terminate job {job_id}: {e}", flush=True)
        return
    print(
        f"{why}: job {job_id} keeps running on {job.temporal.address}; follow it again with:\n"
        f"  {attach_command(job, job_id)}",
        flush=True,
    )


def attach_command(job: JobSpec, job_id: str) -> str:
    """The command line that re-attaches to a job on the job's server (with its TLS and API-key settings)."""
    t = job.temporal
    cmd = f"rollart attach {job_id} --temporal-address {t.address}"
    cmd += f" --namespace {t.namespace}" if t.namespace != "default" else ""
    if t.tls is not None:
        tls = t.tls
        flags = (
            ("--temporal-tls-ca", tls.ca),
            ("--temporal-tls-cert", tls.cert),
            ("--temporal-tls-key", tls.key),
            ("--temporal-tls-server-name", tls.server_name),
        )
        given = [(flag, value) for flag, value in flags if value is not None]
        cmd += "".join(f" {flag} {shlex.quote(str(value))}" for flag, value in given) if given else " --temporal-tls"
    return cmd + (f" --temporal-api-key-env {t.api_key_env}" if t.api_key_env else "")


def is_workflow_failure(e: BaseException) -> bool:
    """The job itself failed (an answer from Temporal, not a client problem): nothing to detach from."""
    from temporalio.client import WorkflowFailureError

    return isinstance(e, WorkflowFailureError)


async def _follow_with_bar(client: Client, handle: WorkflowHandle, writer: MetricsWriter, steps: int) -> TrainingResult:
    """Follow the job to its end: a progress bar on a terminal, one line per step in a log file."""
    from rich.progress import TextColumn

    from rollart.cli.progress import progress_bar
    from rollart.client.connection import Outage
    from rollart.client.train import follow
    from rollart.contracts.training import TrainingStatus, played_success, stall_summary

    with progress_bar(TextColumn("[red]{task.fields[stall]}")) as bar:
        task = bar.add_task("step", total=steps, stats="rolling out ...", stall="")

        def on_step(row: dict) -> None:
            tasks = (
                " ".join(f"{k} {v:.2f}" for k, v in sorted(row["task_success"].items()))
                if len(row["task_success"]) > 1
                else ""
            )
            stats = (
                f"reward {row['reward_mean']:.3f} success {played_success(row):.2f} {tasks} "
                f"stale {row['staleness_mean']:.1f}/{row['staleness_max']} "
                f"{row['trajectories_per_s']:.1f} traj/s {row['tokens_per_s']:.0f} tok/s dropped {row['dropped']}"
                + (f" filtered {row['filtered']}" if row.get("filtered") else "")
            )
            bar.update(task, completed=row["step"] + 1, stats=stats)
            if not bar.console.is_terminal:  # a log file gets one line per step instead of a bar
                print(f"step {row['step'] + 1}/{steps} {row['elapsed_s']:.0f}s {stats}", flush=True)

        shown: list[set[tuple[str, str | None]]] = [set()]

        def on_status(status: TrainingStatus) -> None:
            line = stall_summary(status.stalls, time.time())
            bar.update(task, stall=line)
            stalled = {(x.reason, x.pool) for x in status.stalls}
            if not bar.console.is_terminal and stalled != shown[0]:  # a log file: a line when stalls come or go
                print(line or "stall cleared", flush=True)
            shown[0] = stalled

        def say(line: str) -> None:
            print(line, flush=True)  # above the bar on a terminal (rich redirects stdout), a line in a log file

        return await follow(handle, writer, on_step, on_status=on_status, outage=Outage(say=say), client=client)


async def _report(
    client: Client, job: JobSpec, job_id: str, run_dir: Path, result: TrainingResult, writer: MetricsWriter
) -> None:
    """After the last step: the rollout timeline and plots in the run dir, and the ledger on stdout."""
    from rollart.client.plot import plot_run
    from rollart.client.timeline import collect_timeline, write_timeline
    from rollart.client.train import not_learned_note

    print("collecting the rollout timeline from the workflow histories ...")
    prefix = job.temporal.task_queue_prefix
    write_timeline(await collect_timeline(client, job_id, pools=job.pools, prefix=prefix), run_dir)
    plots = plot_run(run_dir)
    print(
        f"done: {result.steps} steps, policy v{result.version}; trajectories started {result.started} = trained "
        f"{result.trained} + dropped {result.dropped} + {f'filtered {result.filtered} + ' if result.filtered else ''}"
        f"failed {result.failed} + cancelled in flight "
        f"{result.cancelled_in_flight} + buffered {result.buffered_unused}"
    )
    if note := result.end_note():
        print(note)  # learned: success ≥ 0.95 held for 20 steps, ended at step 96 of 200
    if warning := not_learned_note(result, _rows(writer.path), run_dir):
        print(warning)
    if result.last:
        print(f"last step: reward {result.last.reward_mean:.3f}, success {result.last.played_success:.2f}")
    print(f"metrics: {writer.path}   plots: {', '.join(str(p) for p in plots)}")


def _rows(metrics: Path) -> list[dict]:
    """The rows of a run's metrics.jsonl (none if it is missing)."""
    import json

    return [json.loads(line) for line in metrics.read_text().splitlines() if line] if metrics.exists() else []


def _cancel_on_signals() -> asyncio.Event:
    """SIGINT/SIGTERM cancel the running task at its current await (never mid-statement); the event says so."""
    interrupted = asyncio.Event()
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()

    def cancel() -> None:
        interrupted.set()
        if task is not None:
            task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, cancel)
    return interrupted
