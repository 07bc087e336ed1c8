"""Rollout throughput and Temporal's overhead per activity, on the embedded default stack.

Starts the local stack (dev server + a worker process per pool, vLLM on the
CPU), runs N FrozenLake trajectories R times, and reads every workflow's
history to split each activity's time into Temporal's part (schedule → start,
and completion → the next schedule, i.e. the workflow-task round trip) and the
activity's own work (start → completion). Reports medians over the repeats.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

import psutil
from temporalio.client import Client, WorkflowHistory

from bench.report import RESULTS
from rollart.client.rollout import plan_trajectories, run_rollout
from rollart.infra.local.devserver import free_port
from rollart.infra.temporal.connection import connect
from rollart.infra.temporal.history import activity_spans, busy_seconds
from rollart.infra.tiny_model import ensure_tiny_model
from rollart.spec.config import EngineConfig, JobSpec, StoreConfig, TaskSpec
from rollart.spec.pools import Pool
from rollart.workers.local_stack import LocalStack, pools_for_job


def bench_job(home: Path) -> JobSpec:
    """The default example's task (standard 4x4 map, 8 turns) on the tiny model."""
    task = TaskSpec(
        name="frozenlake",
        env="frozenlake",
        reward="success",
        env_args={"maps": "standard"},
        generate_pool=Pool.H800,
        max_turns=8,
        group_size=8,
    )
    return JobSpec(
        name="bench",
        model_dir=home / "model",
        tasks=[task],
        engine=EngineConfig(max_model_len=256),
        store=StoreConfig(path=home / "store"),
    )


def activity_timings(history: WorkflowHistory) -> list[dict]:
    """Per activity: type, pool, and the three intervals in ms (wait, own work, return to the workflow)."""
    return [
        {
            "type": a.activity_type,
            "queue": a.pool + ("@worker" if "@" in a.task_queue else ""),
            "wait_ms": (a.started - a.scheduled) * 1000,
            "work_ms": (a.completed - a.started) * 1000,
            "return_ms": (a.next_command - a.completed) * 1000,
            "start": a.started,
            "end": a.completed,
        }
        for a in activity_spans(history)
        if a.succeeded and a.next_command
    ]


async def one_round(client: Client, stack: LocalStack, job: JobSpec, n: int, seed: int) -> dict:
    job_id = f"bench-{seed}-{int(time.time())}"
    inputs = plan_trajectories(job, n, seed=seed, job_id=job_id)
    cpu0 = cpu_seconds(stack)
    t0 = time.monotonic()
    outcomes = await run_rollout(client, inputs, job_id)
    wall = time.monotonic() - t0
    cpu1 = cpu_seconds(stack)
    done = [o for o in outcomes if o.status == "completed"]
    rows: list[dict] = []
    for workflow_id in dict.fromkeys(o.workflow_id for o in outcomes):  # a group's members share one
        rows += activity_timings(await client.get_workflow_handle(workflow_id).fetch_history())
    gens = [r for r in rows if r["type"] == "generate"]
    tokens = sum(o.result.completion_tokens for o in done if o.result)
    return {
        "wall_s": wall,
        "completed": len(done),
        "trajectories_per_s": len(outcomes) / wall,
        "activities_per_s": len(rows) / wall,
        "activities": len(rows),
        "tokens": tokens,
        "engine_tokens_per_s_busy": tokens / max(busy_seconds([(g["start"], g["end"]) for g in gens]), 1e-9),
        "rows": rows,
        "cpu_share": {k: (cpu1[k] - cpu0[k]) / wall for k in cpu0},
    }


def summarize(rows: list[dict]) -> list[dict]:
    by: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        by[(r["type"], r["queue"])].append(r)
    table = []
    for (kind, queue), rs in sorted(by.items()):
        med = {k: statistics.median(r[k] for r in rs if k in r) for k in ("wait_ms", "work_ms", "return_ms")}
        overhead = med["wait_ms"] + med["return_ms"]
        table.append(
            {
                "activity": kind,
                "queue": queue,
                "count": len(rs),
                **med,
                "overhead_ms": overhead,
                "overhead_share": overhead / (overhead + med["work_ms"]),
            }
        )
    return table


def stack_processes(stack: LocalStack) -> dict[str, list[psutil.Process]]:
    """Each worker process with its children (vLLM's EngineCore), and the server."""
    pids = dict(stack.worker_pids())
    if stack.server and stack.server.pid:
        pids["temporal-server"] = stack.server.pid
    procs = {}
    for name, pid in pids.items():
        p = psutil.Process(pid)
        procs[name] = [p, *p.children(recursive=True)]
    return procs


def worker_memory(stack: LocalStack) -> dict[str, float]:
    """RSS in MiB per process group."""
    return {k: sum(q.memory_info().rss for q in ps) / 2**20 for k, ps in stack_processes(stack).items()}


def cpu_seconds(stack: LocalStack) -> dict[str, float]:
    """CPU seconds (user + system) used so far per process group."""
    return {k: sum(sum(q.cpu_times()[:2]) for q in ps) for k, ps in stack_processes(stack).items()}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench rollout", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="16 trajectories, 2 repeats")
    parser.add_argument("-n", type=int, default=64, help="trajectories per repeat (default 64)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    n, repeats = (16, 2) if args.quick else (args.n, args.repeats)
    home = RESULTS / ".rollout-stack"
    job = bench_job(home)
    ensure_tiny_model(job.model_dir)
    stack = LocalStack(job=job, pools=pools_for_job(job), home=home, port=free_port(), ui_port=None)
    with stack:
        rounds = asyncio.run(_rounds(stack, job, n, repeats))
        memory = worker_memory(stack)
    report(rounds, memory, n)
    return 0


async def _rounds(stack: LocalStack, job: JobSpec, n: int, repeats: int) -> list[dict]:
    client = await connect(stack.temporal, job.store)
    await one_round(client, stack, job, 8, seed=999)  # warm-up: first requests compile kernels
    return [await one_round(client, stack, job, n, seed=i) for i in range(repeats)]


def report(rounds: list[dict], memory: dict[str, float], n: int) -> None:
    med = {
        k: statistics.median(r[k] for r in rounds)
        for k in ("wall_s", "trajectories_per_s", "activities_per_s", "engine_tokens_per_s_busy")
    }
    rows = summarize([row for r in rounds for row in r["rows"]])
    print(f"\nrollout: {n} FrozenLake trajectories (standard 4x4, ≤ 8 turns) x {len(rounds)} repeats, medians")
    print(
        f"  wall {med['wall_s']:.2f} s · {med['trajectories_per_s']:.2f} trajectories/s · "
        f"{med['activities_per_s']:.1f} activities/s · engine {med['engine_tokens_per_s_busy']:.0f} tokens/s while busy"
    )
    print(
        f"\n  {'activity':<10}{'queue':<12}{'count':>7}{'wait ms':>10}{'work ms':>10}{'return ms':>11}"
        f"{'overhead ms':>13}{'overhead share':>16}"
    )
    for r in rows:
        print(
            f"  {r['activity']:<10}{r['queue']:<12}{r['count']:>7}{r['wait_ms']:>10.1f}{r['work_ms']:>10.1f}"
            f"{r['return_ms']:>11.1f}{r['overhead_ms']:>13.1f}{r['overhead_share']:>15.0%}"
        )
    print("\n  wait = scheduled → started (queue + poll), work = started → completed (the activity itself),")
    print("  return = completed → the workflow's next command (workflow-task round trip); overhead = wait + return")
    cpu = {k: statistics.median(r["cpu_share"][k] for r in rounds) for k in rounds[0]["cpu_share"]}
    print("  CPU used per process (cores, of 2): " + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items()))
    print("  memory (RSS incl. children, MiB): " + ", ".join(f"{k} {v:.0f}" for k, v in memory.items()))
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {
        "n": n,
        "repeats": len(rounds),
        "medians": med,
        "activities": rows,
        "memory_mib": memory,
        "cpu_cores": cpu,
        "modes": [{"name": "trajectory", "wall_s": med["wall_s"], "speedup_vs_baseline": 1.0}],
    }
    (RESULTS / "rollout.json").write_text(json.dumps(out, indent=2))
    print(f"\n  written: {RESULTS / 'rollout.json'}")
