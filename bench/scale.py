"""Scale: orchestration alone at 64, 256 and 1,024 trajectories in flight, with 1 and 2 control worker processes.

A training job of one step whose batch is N FrozenLake-shaped trajectories (groups of 8, `rollout_unit:
trajectory`, `TURNS` turns each, async bound 0: the whole batch is started at once) runs on a dev server with
the real control worker (`rollart worker --pool control`, one or two processes on the same task queue). Every
other activity is a stand-in in one separate process (bench/scale_standins.py): `generate` takes a fixed
`--generate-s`, env resets and steps take the env latency model's time (bench/workload.py), reward and
train_step answer at once. So the numbers are Temporal's and the workflows': activities/s, the activities'
queue wait (scheduled → started) and workflow-task latency (scheduled → completed) at p50/p99, history
events and bytes per trajectory, peak trajectories in flight, and the CPU cores the server, the control
workers and the stand-ins used. Every run must end with 0 failed and the ledger balanced.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import time
import uuid
from typing import Any

import psutil
from temporalio.client import Client

from bench.report import RESULTS, format_table, write_results
from bench.rollout import cpu_seconds
from bench.training_run import REPO, stack_for
from bench.workload import LATENCY, NO_LATENCY, frozenlake_task
from rollart.client.train import start_training, status_of
from rollart.infra.temporal.connection import connect
from rollart.infra.temporal.search_attributes import JOB_ID
from rollart.spec.config import JobSpec, StoreConfig, TrainingConfig
from rollart.spec.pools import Pool

__all__ = ["main"]

HOME = RESULTS / ".stack-scale"
SIZES = (64, 256, 1024)
CONTROLS = (1, 2)
TURNS = 2
"""Turns per trajectory: reset, 2 x (generate, step), reward, close = 7 activities each."""


def scale_job(n: int) -> JobSpec:
    """One training step of `n` trajectories (groups of 8, TURNS turns), all started at once (bound 0)."""
    task = frozenlake_task(NO_LATENCY, pool=Pool.H800, max_turns=TURNS, rollout_unit="trajectory")
    training = TrainingConfig(
        steps=1, batch_size=n, async_bound=0, rollout_mode="trajectory", continue_as_new_every=1000
    )
    return JobSpec(
        name="scale", model_dir=HOME / "model", tasks=[task], training=training, store=StoreConfig(path=HOME / "store")
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench scale", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="64 trajectories only, 1 and 2 control processes")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="trajectories in flight per run")
    parser.add_argument("--controls", default=",".join(map(str, CONTROLS)), help="control worker processes")
    parser.add_argument("--generate-s", type=float, default=0.05, help="the stand-in engine's latency per call")
    args = parser.parse_args(argv)
    sizes = [64] if args.quick else [int(x) for x in args.sizes.split(",")]
    rows = []
    for controls in (int(x) for x in args.controls.split(",")):
        print(f"scale: {controls} control process(es); starting the stack ...", flush=True)
        rows += _with_stack(controls, sizes, args.generate_s)
    report(rows, args.generate_s)
    failed = [r for r in rows if r["failed"] or not r["ledger_balanced"] or r["trained"] != r["n"]]
    return 1 if failed else 0


def _with_stack(controls: int, sizes: list[int], generate_s: float) -> list[dict[str, Any]]:
    """A fresh server and `controls` control workers, the stand-in process, then one run per size."""
    home = HOME / f"control-{controls}"
    shutil.rmtree(home, ignore_errors=True)
    job = scale_job(sizes[0])
    with stack_for(job, home, [Pool.CONTROL]) as stack:
        for _ in range(controls - 1):
            stack.add_worker(Pool.CONTROL)
        cmd = [
            sys.executable,
            "-m",
            "bench.scale_standins",
            stack.address,
            "--store",
            str(job.store.path),
            "--generate-s",
            str(generate_s),
            "--turns",
            str(TURNS),
        ]
        standins = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
        try:
            if standins.stdout is None or standins.stdout.readline().strip() != "READY":
                raise RuntimeError(f"the stand-in activity process did not start (exit {standins.poll()})")
            return [asyncio.run(_run(stack, n, controls, standins.pid)) for n in sizes]
        finally:
            standins.terminate()
            standins.wait(30)


async def _run(stack: Any, n: int, controls: int, standins_pid: int) -> dict[str, Any]:
    """One training step of n trajectories; the numbers from its histories and the processes' CPU times."""
    client = await connect(stack.temporal, stack.store)
    job = scale_job(n).model_copy(update={"temporal": stack.temporal})
    job_id = f"scale-{n}-c{controls}-{uuid.uuid4().hex[:6]}"
    standins = psutil.Process(standins_pid)
    cpu0, s0 = cpu_seconds(stack), sum(standins.cpu_times()[:2])
    t0 = time.monotonic()
    handle = await start_training(client, job, job_id, HOME / "runs" / job_id)
    result = await handle.result()
    wall = time.monotonic() - t0
    cpu1, s1 = cpu_seconds(stack), sum(standins.cpu_times()[:2])
    status = await status_of(handle)
    h = await histories(client, job_id)
    waits = sorted(a["wait"] for a in h["activities"])
    wft = sorted(h["workflow_tasks"])
    row: dict[str, Any] = {
        "name": f"{n} x {controls} control",
        "n": n,
        "controls": controls,
        "wall_s": wall,
        "trained": result.trained,
        "failed": result.failed,
        "dropped": result.dropped,
        "started": result.started,
        "ledger_balanced": status.ledger_balanced,
        "activities": len(waits),
        "activities_per_s": len(waits) / wall,
        "peak_in_flight": h["peak_in_flight"],
        "start_spread_s": h["start_spread_s"],
        "wait_ms_p50": 1000 * _q(waits, 0.5),
        "wait_ms_p99": 1000 * _q(waits, 0.99),
        "wft_ms_p50": 1000 * _q(wft, 0.5),
        "wft_ms_p99": 1000 * _q(wft, 0.99),
        "events_per_trajectory": h["events"] / max(h["trajectories"], 1),
        "bytes_per_trajectory": h["bytes"] / max(h["trajectories"], 1),
        "cores_server": (cpu1["temporal-server"] - cpu0["temporal-server"]) / wall,
        "cores_control": sum(cpu1[k] - cpu0[k] for k in cpu0 if k.startswith("control")) / wall,
        "cores_standins": (s1 - s0) / wall,
    }
    ledger = "ok" if row["ledger_balanced"] else "UNBALANCED"
    print(
        f"  {row['name']:<18} {wall:6.1f} s  {row['activities_per_s']:6.1f} act/s  "
        f"peak {row['peak_in_flight']} in flight  failed {row['failed']}  ledger {ledger}",
        flush=True,
    )
    return row


def _q(sorted_values: list[float], q: float) -> float:
    """The q-quantile of already sorted values (nearest rank), nan when there are none."""
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))] if sorted_values else float("nan")


async def histories(client: Client, job_id: str, concurrency: int = 16) -> dict[str, Any]:
    """From every trajectory workflow of the job: activity queue waits, workflow-task latencies, history events
    and bytes, the peak number of trajectories running at once (from their first and last events) and how long
    the server took to start them all (the training workflow asks for the whole batch in one workflow task)."""
    ids = [
        (wf.id, wf.run_id)
        async for wf in client.list_workflows(f'{JOB_ID.name} = "{job_id}"')
        if wf.workflow_type == "TrajectoryWorkflow"
    ]
    gate = asyncio.Semaphore(concurrency)
    out: dict[str, Any] = {"activities": [], "workflow_tasks": [], "events": 0, "bytes": 0, "trajectories": len(ids)}
    spans: list[tuple[float, float]] = []

    async def one(wid: str, run_id: str) -> None:
        async with gate:
            history = await client.get_workflow_handle(wid, run_id=run_id).fetch_history()
        scheduled: dict[int, float] = {}
        wft_scheduled = 0.0
        for e in history.events:
            t = e.event_time.ToDatetime().timestamp()
            if e.HasField("activity_task_scheduled_event_attributes"):
                scheduled[e.event_id] = t
            elif e.HasField("activity_task_started_event_attributes"):
                sid = e.activity_task_started_event_attributes.scheduled_event_id
                out["activities"].append({"wait": t - scheduled[sid]})
            elif e.HasField("workflow_task_scheduled_event_attributes"):
                wft_scheduled = t
            elif e.HasField("workflow_task_completed_event_attributes"):
                out["workflow_tasks"].append(t - wft_scheduled)
        out["events"] += len(history.events)
        out["bytes"] += sum(e.ByteSize() for e in history.events)
        times = [e.event_time.ToDatetime().timestamp() for e in (history.events[0], history.events[-1])]
        spans.append((times[0], times[1]))

    await asyncio.gather(*(one(w, r) for w, r in ids))
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running = peak = 0
    for _, d in edges:
        running += d
        peak = max(peak, running)
    out["peak_in_flight"] = peak
    starts = [s for s, _ in spans]
    out["start_spread_s"] = max(starts) - min(starts) if starts else 0.0
    return out


COLUMNS = [
    ("n", "trajectories", ".0f"),
    ("controls", "control procs", ".0f"),
    ("peak_in_flight", "peak in flight", ".0f"),
    ("start_spread_s", "all started in s", ".1f"),
    ("failed", "failed", ".0f"),
    ("ledger_balanced", "ledger", ""),
    ("wall_s", "wall s", ".1f"),
    ("activities_per_s", "activities/s", ".1f"),
    ("wait_ms_p50", "wait p50 ms", ".0f"),
    ("wait_ms_p99", "wait p99 ms", ".0f"),
    ("wft_ms_p50", "wf task p50 ms", ".0f"),
    ("wft_ms_p99", "wf task p99 ms", ".0f"),
    ("events_per_trajectory", "events/traj", ".1f"),
    ("bytes_per_trajectory", "bytes/traj", ".0f"),
    ("cores_server", "server cores", ".2f"),
    ("cores_control", "control cores", ".2f"),
    ("cores_standins", "stand-in cores", ".2f"),
]


def report(rows: list[dict[str, Any]], generate_s: float) -> None:
    """Print the table and the 2-vs-1 control process ratio per size; write bench/results/scale.json."""
    print(
        f"\nscale: one training step of N trajectories ({TURNS} turns, 7 activities each), stand-in engine "
        f"{generate_s * 1000:.0f} ms per generate, env latency reset median {LATENCY['reset_median_s']} s / "
        f"p99 {LATENCY['reset_p99_s']} s"
    )
    print(format_table(rows, COLUMNS))
    ratios = {}
    for n in sorted({r["n"] for r in rows}):
        by = {r["controls"]: r for r in rows if r["n"] == n}
        if 1 in by and 2 in by:
            ratios[str(n)] = by[2]["activities_per_s"] / by[1]["activities_per_s"]
            print(f"  {n}: activities/s with 2 control processes / 1 = {ratios[str(n)]:.2f} (goal ≥ 1.3)")
    for r in rows:
        r["speedup_vs_baseline"] = ratios.get(str(r["n"]), 1.0) if r["controls"] == 2 else 1.0
    path = write_results(
        "scale",
        rows,
        baseline="1 control process",
        turns=TURNS,
        generate_s=generate_s,
        latency=LATENCY,
        control_ratio=ratios,
    )
    print(f"\n  written: {path}")
