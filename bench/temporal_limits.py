"""Temporal's per-execution load of a training job, read from its real histories, against the server's limits.

    python -m bench temporal [--batch 32] [--steps 30] [--units trajectory,group,free] [--quick]

Each unit (`rollout_unit: trajectory`, `group` in lockstep, `group` with free members) trains a FrozenLake-shaped
job (groups of 8, `--turns` turns (2), bound 1) for `--steps` steps on a dev server whose per-execution limits are
Temporal's defaults scaled by batch / 512 (a batch of 32 meets a sixteenth of them, as a job of the paper's 512
meets all of them), with the job told the same (`temporal.limits`). The control worker is the real one; every
other activity is a stand-in (bench/scale_standins.py), so only orchestration is measured. Reported:

- per run of the training workflow (continue-as-new starts another): its events, bytes and signals, and the
  largest share of a limit any run reached (the target: at most `temporal.limits.continue_at`, 10 %);
- per trajectory: the events, bytes and actions of its unit's workflow and the parent's share. Actions are
  counted from the histories as Temporal Cloud bills them (a workflow start, an activity attempt, a timer, a
  signal sent or taken, a child started, a search-attribute upsert, a cancel request); heartbeats never reach a
  history and the stand-ins send none, so they are not in these numbers;
- the ledger: every trajectory trained, dropped, failed or cancelled, none lost; a run fails on a failure;
- the peak of trajectories in flight at a step, and the largest unit workflow's share of the event and size
  limits (`--batch 2000 --units free --name temporal-4000`: a chat or agent job's 4,000 in flight as free groups).

`--batch 512 --steps 30` is the paper's shape on Temporal's own limits, the soak (`temporal-soak.json`).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter
from typing import Any

from temporalio.client import Client

from bench.report import RESULTS, format_table, write_results
from bench.training_run import REPO, stack_for
from bench.workload import NO_LATENCY, frozenlake_task
from rollart.client.train import start_training, status_of
from rollart.infra.temporal.connection import connect
from rollart.infra.temporal.search_attributes import JOB_ID
from rollart.spec.config import JobSpec, StoreConfig, TemporalLimits, TrainingConfig
from rollart.spec.pools import Pool

__all__ = ["actions_of", "main"]

HOME = RESULTS / ".stack-temporal"
TURNS = 2
PAPER_BATCH = 512
UNITS = {"trajectory": ("trajectory", "lockstep"), "group": ("group", "lockstep"), "free": ("group", "free")}
"""Each unit: its `rollout_unit` and `group_play`."""

ACTION_EVENTS = (
    "workflow_execution_started_event_attributes",
    "activity_task_scheduled_event_attributes",
    "timer_started_event_attributes",
    "signal_external_workflow_execution_initiated_event_attributes",
    "workflow_execution_signaled_event_attributes",
    "start_child_workflow_execution_initiated_event_attributes",
    "upsert_workflow_search_attributes_event_attributes",
    "request_cancel_external_workflow_execution_initiated_event_attributes",
    "workflow_execution_update_accepted_event_attributes",
)
"""History events that are billed actions (an activity's retries: one more per attempt past the first)."""


def scaled_limits(batch: int) -> TemporalLimits:
    """Temporal's default limits scaled by batch / 512: a small job meets the share a paper-sized one does."""
    d, f = TemporalLimits(), min(1.0, batch / PAPER_BATCH)
    return TemporalLimits(
        history_events=max(100, int(d.history_events * f)),
        history_bytes=max(100_000, int(d.history_bytes * f)),
        signals=max(10, int(d.signals * f)),
    )


def unit_job(unit: str, batch: int, steps: int, turns: int = TURNS) -> JobSpec:
    rollout_unit, play = UNITS[unit]
    task = frozenlake_task(NO_LATENCY, pool=Pool.H800, max_turns=turns, rollout_unit=rollout_unit, group_play=play)
    training = TrainingConfig(steps=steps, batch_size=batch, async_bound=1, stall={"enabled": False})
    return JobSpec(
        name=f"temporal-{unit}",
        model_dir=HOME / "model",
        tasks=[task],
        training=training,
        store=StoreConfig(path=HOME / "store"),
        temporal={"limits": scaled_limits(batch).model_dump()},
    )


def actions_of(events: list[Any]) -> int:
    """The billed actions of one history (see ACTION_EVENTS); heartbeats are not in a history."""
    n = sum(1 for e in events if e.WhichOneof("attributes") in ACTION_EVENTS)
    retries = sum(
        e.activity_task_started_event_attributes.attempt - 1
        for e in events
        if e.HasField("activity_task_started_event_attributes")
    )
    return n + retries


async def parent_runs(client: Client, job_id: str, limits: TemporalLimits) -> list[dict[str, Any]]:
    """Every run of the training workflow, oldest first: its events, bytes, signals and steps, and their share of
    the limits."""
    runs, run_id = [], None
    while True:
        history = await client.get_workflow_handle(job_id, run_id=run_id).fetch_history()
        events = list(history.events)
        kinds = Counter(e.WhichOneof("attributes") for e in events)
        size = sum(e.ByteSize() for e in events)
        steps = sum(
            1
            for e in events
            if e.HasField("activity_task_scheduled_event_attributes")
            and e.activity_task_scheduled_event_attributes.activity_type.name == "train_step"
        )
        signals = kinds["workflow_execution_signaled_event_attributes"]
        share = max(len(events) / limits.history_events, size / limits.history_bytes, signals / limits.signals)
        by_kind = Counter()
        for e in events:
            by_kind[e.WhichOneof("attributes").removesuffix("_event_attributes")] += e.ByteSize()
        runs.append(
            {
                "bytes_by_event": dict(by_kind),
                "events": len(events),
                "bytes": size,
                "signals": signals,
                "steps": steps,
                "actions": actions_of(events),
                "share": share,
            }
        )
        started = events[0].workflow_execution_started_event_attributes
        if not started.continued_execution_run_id:
            return runs[::-1]
        run_id = started.continued_execution_run_id


async def unit_histories(client: Client, job_id: str, concurrency: int = 16) -> dict[str, int]:
    """Events, bytes and actions of every unit workflow of the job (trajectory and group workflows)."""
    ids = [
        (wf.id, wf.run_id)
        async for wf in client.list_workflows(f'{JOB_ID.name} = "{job_id}"')
        if wf.workflow_type != "TrainingWorkflow"
    ]
    gate, out = asyncio.Semaphore(concurrency), Counter()

    async def one(wid: str, run_id: str) -> None:
        async with gate:
            history = await client.get_workflow_handle(wid, run_id=run_id).fetch_history()
        size = sum(e.ByteSize() for e in history.events)
        out["workflows"] += 1
        out["events"] += len(history.events)
        out["bytes"] += size
        out["actions"] += actions_of(list(history.events))
        out["max_events"] = max(out["max_events"], len(history.events))  # the largest unit, against the limits
        out["max_bytes"] = max(out["max_bytes"], size)

    await asyncio.gather(*(one(w, r) for w, r in ids))
    return dict(out)


async def measure(address: Any, unit: str, batch: int, steps: int, turns: int = TURNS) -> dict[str, Any]:
    """One job of `unit` to its last step; its parent's runs, its units' histories and its ledger."""
    stack_temporal, store = address
    client = await connect(stack_temporal, store)
    job = unit_job(unit, batch, steps, turns).model_copy(update={"temporal": stack_temporal})
    job_id = f"temporal-{unit}-{uuid.uuid4().hex[:6]}"
    t0 = time.monotonic()
    handle = await start_training(client, job, job_id, HOME / "runs" / job_id)
    result = await handle.result()
    wall = time.monotonic() - t0
    status = await status_of(handle)
    runs = await parent_runs(client, job_id, job.temporal.limits)
    units = await unit_histories(client, job_id)
    n = max(result.started, 1)
    parent = {k: sum(r[k] for r in runs) for k in ("events", "bytes", "signals", "actions")}
    row = {
        "name": unit,
        "batch": batch,
        "steps": result.steps,
        "wall_s": wall,
        "limits": job.temporal.limits.model_dump(),
        "started": result.started,
        "trained": result.trained,
        "failed": result.failed,
        "dropped": result.dropped,
        "cancelled": result.cancelled_in_flight,
        "ledger_balanced": status.ledger_balanced,
        "runs": runs,
        "max_share": max(r["share"] for r in runs),
        "unit_workflows": units.get("workflows", 0),
        "unit_max_share": max(
            units.get("max_events", 0) / job.temporal.limits.history_events,
            units.get("max_bytes", 0) / job.temporal.limits.history_bytes,
        ),
        "peak_in_flight": max((r.in_flight for r in status.history), default=0),
        "events_per_trajectory": units.get("events", 0) / n,
        "bytes_per_trajectory": units.get("bytes", 0) / n,
        "actions_per_trajectory": units.get("actions", 0) / n,
        "parent_events_per_trajectory": parent["events"] / n,
        "parent_bytes_per_trajectory": parent["bytes"] / n,
        "parent_actions_per_trajectory": parent["actions"] / n,
        "parent_events_per_step": parent["events"] / max(result.steps, 1),
        "parent_bytes_per_step": parent["bytes"] / max(result.steps, 1),
        "parent_bytes_by_event": {
            kind: round(sum(r["bytes_by_event"].get(kind, 0) for r in runs) / n)
            for kind in sorted({k for r in runs for k in r["bytes_by_event"]})
        },
    }
    print(
        f"  {unit:<10} {wall:6.1f} s  {result.steps} steps, {len(runs)} runs (max {100 * row['max_share']:.1f} % of "
        f"a limit)  failed {result.failed}  ledger {'ok' if row['ledger_balanced'] else 'UNBALANCED'}",
        flush=True,
    )
    return row


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench temporal", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=32, help="trajectories a step (limits scale by batch / 512)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--units", default=",".join(UNITS), help=f"of {', '.join(UNITS)}")
    parser.add_argument("--quick", action="store_true", help="batch 16, 4 steps")
    parser.add_argument("--generate-s", type=float, default=0.02, help="the stand-in engine's latency per call")
    parser.add_argument("--turns", type=int, default=TURNS, help="turns of each episode")
    parser.add_argument(
        "--name", help="the results file (default: temporal; temporal-soak from batch 512; temporal-quick)"
    )
    args = parser.parse_args(argv)
    batch, steps = (16, 4) if args.quick else (args.batch, args.steps)
    units = args.units.split(",")
    home = HOME / "stack"
    shutil.rmtree(home, ignore_errors=True)
    job = unit_job(units[0], batch, steps, args.turns)
    print(f"temporal: batch {batch}, {steps} steps, limits {job.temporal.limits.model_dump()}", flush=True)
    with stack_for(job, home, [Pool.CONTROL]) as stack:
        cmd = [sys.executable, "-m", "bench.scale_standins", stack.address, "--store", str(job.store.path)]
        cmd += ["--generate-s", str(args.generate_s), "--turns", str(args.turns)]
        standins = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
        try:
            if standins.stdout is None or standins.stdout.readline().strip() != "READY":
                raise RuntimeError(f"the stand-in activity process did not start (exit {standins.poll()})")
            rows = [asyncio.run(measure((stack.temporal, stack.store), u, batch, steps, args.turns)) for u in units]
        finally:
            standins.terminate()
            standins.wait(30)
    # a quick run leaves the docs' numbers alone; a paper-sized one (the soak, default limits) is kept apart
    name = args.name or ("temporal-quick" if args.quick else "temporal-soak" if batch >= PAPER_BATCH else "temporal")
    report(rows, name, args.turns)
    bad = [r for r in rows if r["failed"] or not r["ledger_balanced"] or r["max_share"] > 0.1 + 0.05]
    return 1 if bad else 0


COLUMNS = [
    ("name", "unit", ""),
    ("run_count", "runs", ""),
    ("max_share", "max of a limit", ".1%"),
    ("events_per_trajectory", "events/traj", ".1f"),
    ("kb_per_trajectory", "KB/traj", ".2f"),
    ("actions_per_trajectory", "actions/traj", ".1f"),
    ("parent_events_per_trajectory", "parent events/traj", ".1f"),
    ("parent_kb_per_trajectory", "parent KB/traj", ".2f"),
    ("parent_actions_per_trajectory", "parent actions/traj", ".2f"),
    ("peak_in_flight", "in flight at a step", ""),
    ("unit_max_share", "largest unit", ".1%"),
    ("failed", "failed", ""),
    ("ledger_balanced", "ledger ok", ""),
]


def report(rows: list[dict[str, Any]], name: str = "temporal", turns: int = TURNS) -> None:
    for r in rows:
        r["run_count"] = len(r["runs"])
        r["kb_per_trajectory"] = r["bytes_per_trajectory"] / 1000
        r["parent_kb_per_trajectory"] = r["parent_bytes_per_trajectory"] / 1000
    print(format_table(rows, COLUMNS))
    write_results(name, rows, turns=turns)
