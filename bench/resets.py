"""Reset success under injected failures: many `reset` activities through a real dev server and env workers.

Starts a dev server (SQLite) and two cpu worker processes (real EnvActivities,
no engine), then runs N FrozenLake resets as a trajectory makes them (the
`reset` activity with its retry policy) from W concurrent workflows, with a
fault model of lognormal reset latency (median 50 ms, p99 1 s), a 2 s reset
timeout and 5 % injected reset failures — with and without the pre-reset pool.
Reports the share of resets that succeeded (after retries), how many activity
attempts were retried, and the reset latency as the trajectory sees it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import Worker

from bench.report import RESULTS
from bench.reset_workflow import ResetBenchInput, ResetBenchResult, ResetBenchWorkflow
from rollart.infra.local.devserver import free_port
from rollart.infra.temporal.connection import connect
from rollart.spec.config import FaultModel, JobSpec, LatencyModel, StoreConfig, TaskSpec
from rollart.spec.pools import Pool
from rollart.workers.local_stack import LocalStack

FAULTS = FaultModel(reset_latency=LatencyModel(median_s=0.05, p99_s=1.0), reset_failure_p=0.05, seed=0)


def task(pool_size: int) -> TaskSpec:
    return TaskSpec(
        name="frozenlake",
        env="frozenlake",
        reward="success",
        env_args={"maps": "random", "size": 4},
        faults=FAULTS,
        reset_pool_size=pool_size,
        reset_timeout_s=2.0,
    )


async def one_config(client: Client, pool_size: int, n: int, workflows: int) -> dict:
    queue = f"bench-resets-{uuid.uuid4().hex[:6]}"
    per = n // workflows
    t = task(pool_size)
    async with Worker(client, task_queue=queue, workflows=[ResetBenchWorkflow]):
        t0 = time.monotonic()
        handles = [
            await client.start_workflow(
                ResetBenchWorkflow.run,
                ResetBenchInput(task=t, seeds=list(range(w * per, (w + 1) * per))),
                id=f"{queue}-{w}",
                task_queue=queue,
            )
            for w in range(workflows)
        ]
        results: list[ResetBenchResult] = [await h.result() for h in handles]
        wall = time.monotonic() - t0
    attempts = retried = 0
    for h in handles:
        for ev in (await h.fetch_history()).events:
            if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                attempts += ev.activity_task_started_event_attributes.attempt
                retried += ev.activity_task_started_event_attributes.attempt > 1
    ok, failed = sum(r.ok for r in results), sum(r.failed for r in results)
    lat = sorted(x for r in results for x in r.latencies_s)
    return {
        "reset_pool_size": pool_size,
        "resets": ok + failed,
        "succeeded": ok,
        "failed": failed,
        "success_rate": ok / (ok + failed),
        "activity_attempts": attempts,
        "resets_retried": retried,
        "latency_p50_s": statistics.median(lat),
        "latency_p99_s": lat[int(0.99 * (len(lat) - 1))],
        "latency_max_s": lat[-1],
        "wall_s": wall,
        "resets_per_s": (ok + failed) / wall,
        "errors": sorted({e for r in results for e in r.errors})[:5],
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench resets", description=__doc__)
    parser.add_argument("-n", type=int, default=10_000, help="resets per configuration (default 10,000)")
    parser.add_argument("--workflows", type=int, default=100, help="concurrent workflows (default 100)")
    parser.add_argument("--pool-sizes", default="0,2", help="reset_pool_size values to compare (default 0,2)")
    parser.add_argument("--quick", action="store_true", help="1,000 resets per configuration")
    args = parser.parse_args(argv)
    n = 1000 if args.quick else args.n
    home = Path(tempfile.mkdtemp(prefix="rollart-bench-resets-"))
    job = JobSpec(name="bench-resets", tasks=[task(0)], store=StoreConfig(path=home / "store"))
    stack = LocalStack(job=job, pools=[Pool.CPU, Pool.CPU], home=home, port=free_port(), ui_port=None)
    with stack:
        rows = asyncio.run(_run(stack, job, n, args.workflows, [int(x) for x in args.pool_sizes.split(",")]))
    report(rows, n)
    return 0


async def _run(stack: LocalStack, job: JobSpec, n: int, workflows: int, sizes: list[int]) -> list[dict]:
    client = await connect(stack.temporal, job.store)
    return [await one_config(client, size, n, workflows) for size in sizes]


def report(rows: list[dict], n: int) -> None:
    f = FAULTS
    print(f"\nresets: {n} FrozenLake resets per configuration through Temporal, 2 cpu worker processes;")
    print(
        f"  injected: reset latency lognormal median {f.reset_latency.median_s:g} s / p99 {f.reset_latency.p99_s:g} s,"
        f" {f.reset_failure_p:.0%} reset failures, reset timeout 2 s, reset policy: up to 4 attempts\n"
    )
    print(
        f"  {'pool':>4}{'resets':>8}{'failed':>8}{'success':>11}{'retried':>9}{'p50 s':>8}{'p99 s':>8}{'max s':>8}"
        f"{'resets/s':>10}"
    )
    for r in rows:
        print(
            f"  {r['reset_pool_size']:>4}{r['resets']:>8}{r['failed']:>8}{r['success_rate']:>11.4%}"
            f"{r['resets_retried']:>9}{r['latency_p50_s']:>8.3f}{r['latency_p99_s']:>8.3f}{r['latency_max_s']:>8.2f}"
            f"{r['resets_per_s']:>10.1f}"
        )
    print(
        "\n  retried = reset activities that needed a 2nd+ attempt; latency = the trajectory's view (retries included)"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "resets.json").write_text(json.dumps({"n": n, "faults": FAULTS.model_dump(), "rows": rows}, indent=2))
    print(f"\n  written: {RESULTS / 'resets.json'}")
