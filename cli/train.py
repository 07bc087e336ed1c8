"""`rollart train`: start a training job and follow it with a progress bar; metrics, checkpoints and plots."""

from __future__ import annotations

import argparse
import asyncio
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rollart.cli.spec import add_temporal_args, check_components, load_spec
from rollart.cli.stack import add_stack_args, connect_client, server_for

if TYPE_CHECKING:
    from rollart.client.train import MetricsWriter
    from rollart.contracts.training import TrainingResult
    from rollart.infra.config import JobSpec
    from temporalio.client import Client, WorkflowHandle

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `train`; --steps, --async-bound and --rollout-mode override the job's `training` section."""
    s = sub.add_parser("train", help="train a policy: rollout and training overlapped under the async bound")
    s.add_argument("job", type=Path, help="job spec (YAML or JSON)")
    s.add_argument("--steps", type=int, help="train steps (default: the job's training.steps)")
    s.add_argument("--async-bound", type=int, help="max policy versions a trajectory may lag (0 = on-policy)")
    s.add_argument("--rollout-mode", choices=["trajectory", "batch"], help="trajectory (RollArt) or batch (lockstep)")
    s.add_argument("--run-dir", type=Path, help="where metrics.jsonl, checkpoints and plots go (default runs/JOB_ID)")
    add_temporal_args(s)
    s.add_argument("--ui-url", help="Temporal UI base URL for links (default: http://HOST:8233)")
    add_stack_args(s)
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Train on the job's server, or on a local stack started for the run (and stopped after it)."""
    from rollart.client.rollout import new_job_id

    job = load_spec(args.job, args)
    check_components(job, args.job)
    job_id = new_job_id(job)
    run_dir = (args.run_dir or Path("runs") / job_id).resolve()
    with server_for(job, args, training=True) as server:
        return asyncio.run(_train(server.job, job_id, run_dir, server.ui, terminate_on_interrupt=server.local))


async def _train(job: JobSpec, job_id: str, run_dir: Path, ui: str, terminate_on_interrupt: bool) -> int:
    """Start and follow a job. Interrupted: on the local stack the job is terminated (its workers are going
    away with the stack); on a shared server it keeps running and `rollart status` finds it again."""
    from rollart.client.train import MetricsWriter, start_training, terminate_job
    from rollart.infra.temporal import ui_url

    client = await connect_client(job)
    t = job.training
    handle = await start_training(client, job, job_id, run_dir)
    print(f"job {job_id}: {t.steps} steps, batch {t.batch_size}, async bound {t.async_bound}, "
          f"{t.rollout_mode} rollout; run dir {run_dir}")  # fmt: skip
    if ui:
        print(f"Temporal UI: {ui_url(ui, job.temporal.namespace, job_id)}")
    writer = MetricsWriter(run_dir)
    interrupted = _cancel_on_signals()
    try:
        result = await _follow_with_bar(handle, writer, t.steps)
    except asyncio.CancelledError:
        if not interrupted.is_set():
            raise
        if terminate_on_interrupt:
            n = await terminate_job(client, job_id, "rollart train was interrupted")
            print(f"interrupted: terminated the job's {n} running workflows", flush=True)
        else:
            print(f"interrupted: job {job_id} keeps running on {job.temporal.address}", flush=True)
        return 130
    await _report(client, job_id, run_dir, result, writer)
    return 0


async def _follow_with_bar(handle: WorkflowHandle, writer: MetricsWriter, steps: int) -> TrainingResult:
    """Follow the job to its end: a progress bar on a terminal, one line per step in a log file."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rollart.client.train import follow
    from rollart.contracts.training import TrainingStatus, stall_summary

    columns = [TextColumn("step"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.fields[stats]}"),
               TextColumn("[red]{task.fields[stall]}")]
    with Progress(*columns) as bar:
        task = bar.add_task("train", total=steps, stats="rolling out ...", stall="")

        def on_step(row: dict) -> None:
            tasks = " ".join(f"{k} {v:.2f}" for k, v in sorted(row["task_success"].items())) if len(row["task_success"]) > 1 else ""
            stats = (f"reward {row['reward_mean']:.3f} success {row['success_rate']:.2f} {tasks} "
                     f"stale {row['staleness_mean']:.1f}/{row['staleness_max']} "
                     f"{row['trajectories_per_s']:.1f} traj/s {row['tokens_per_s']:.0f} tok/s dropped {row['dropped']}")  # fmt: skip
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

        return await follow(handle, writer, on_step, on_status=on_status)


async def _report(client: Client, job_id: str, run_dir: Path, result: TrainingResult, writer: MetricsWriter) -> None:
    """After the last step: the rollout timeline and plots in the run dir, and the ledger on stdout."""
    from rollart.client.plot import plot_run
    from rollart.client.timeline import collect_timeline, write_timeline

    print("collecting the rollout timeline from the workflow histories ...")
    write_timeline(await collect_timeline(client, job_id), run_dir)
    plots = plot_run(run_dir)
    print(f"done: {result.steps} steps, policy v{result.version}; trajectories started {result.started} = trained "
          f"{result.trained} + dropped {result.dropped} + failed {result.failed} + cancelled in flight "
          f"{result.cancelled_in_flight} + buffered {result.buffered_unused}")  # fmt: skip
    if result.last:
        print(f"last step: reward {result.last.reward_mean:.3f}, success {result.last.success_rate:.2f}")
    print(f"metrics: {writer.path}   plots: {', '.join(str(p) for p in plots)}")


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
