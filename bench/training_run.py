"""One measured training job on a running local stack, and the stack the training benchmarks share.

`measure_job` starts a TrainingWorkflow, waits for it, and reads its timeline
(every activity of the job's workflows, from their histories) to report wall
time, trajectories/s and each pool's busy fraction: the share of the wall time
during which at least one activity of that pool was running (generation pools:
the engine had a request in flight).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import Client

from rollart.client.train import start_training
from rollart.contracts.training import TrainingStatus
from rollart.infra.local.devserver import free_port
from rollart.infra.temporal.history import activity_spans, busy_seconds
from rollart.infra.temporal.search_attributes import JOB_ID, TASK
from rollart.infra.tiny_model import ensure_tiny_model
from rollart.spec.checks import check_job_components
from rollart.spec.config import JobSpec
from rollart.spec.pools import Pool
from rollart.workers.local_stack import LocalStack

__all__ = ["POOLS_REPORTED", "job_timeline", "measure_job", "stack_for", "unit_seconds"]

POOLS_REPORTED = ("cpu", "h800", "h20", "serverless", "trainer")
REPO = Path(__file__).resolve().parent.parent


def stack_for(job: JobSpec, home: Path, pools: list[Pool]) -> LocalStack:
    """A local stack on free loopback ports under `home` (no UI); workers can import `bench.*`."""
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    ensure_tiny_model(job.model_dir)
    check_job_components(job)
    return LocalStack(job=job, pools=pools, home=home, port=free_port(), ui_port=None)


async def measure_job(
    client: Client, job: JobSpec, label: str, run_root: Path, stack: LocalStack | None = None
) -> dict[str, Any]:
    """Run `job` to its last step; wall time, trajectories/s and per-pool busy fractions from its timeline,
    Temporal's share per activity (median queue wait, workflow-task return) and, given the stack, the CPU
    cores its server and workers used."""
    from bench.rollout import cpu_seconds

    job_id = f"bench-{label}-{uuid.uuid4().hex[:6]}"
    cpu0 = cpu_seconds(stack) if stack else {}
    t0 = time.monotonic()
    handle = await start_training(client, job, job_id, run_root / job_id)
    result = await handle.result()
    wall = time.monotonic() - t0
    cpu1 = cpu_seconds(stack) if stack else {}
    timeline = await job_timeline(client, job_id)
    finished = result.trained + result.dropped + result.failed + result.buffered_unused
    out: dict[str, Any] = {
        "wall_s": wall,
        "steps": result.steps,
        "trajectories_per_s": finished / wall,
        "trained": result.trained,
        "dropped": result.dropped,
        "failed": result.failed,
        "started": result.started,
        "activities": len(timeline),
    }
    for pool in POOLS_REPORTED:
        spans = [(r["start"], r["end"]) for r in timeline if r["pool"] == pool]
        if spans:
            out[f"busy_{pool}"] = busy_seconds(spans) / wall
    gen = [(r["start"], r["end"]) for r in timeline if r["pool"] in ("h800", "h20")]
    out["busy_generation"] = busy_seconds(gen) / wall if gen else 0.0
    workers = sorted({r["worker"] for r in timeline if r["pool"] in ("h800", "h20")})
    out["busy_per_gen_worker"] = {
        w: busy_seconds([(r["start"], r["end"]) for r in timeline if r["worker"] == w]) / wall for w in workers
    }
    if workers:
        out["gen_worker_busy_min"] = min(out["busy_per_gen_worker"].values())
        out["gen_worker_busy_max"] = max(out["busy_per_gen_worker"].values())
    out["generate_calls"] = sum(1 for r in timeline if r["pool"] in ("h800", "h20"))
    gen_s = sorted(r["end"] - r["start"] for r in timeline if r["pool"] in ("h800", "h20"))
    if gen_s:
        out["generate_p50_s"] = gen_s[len(gen_s) // 2]
    waits = sorted(r["start"] - r["scheduled"] for r in timeline)
    returns = sorted(r["next"] - r["end"] for r in timeline if r["next"])
    if waits:
        out["wait_ms_p50"] = 1000 * waits[len(waits) // 2]
    if returns:
        out["return_ms_p50"] = 1000 * returns[len(returns) // 2]
    for name in cpu0:  # "control#0", "temporal-server", ...: cores used over the run
        out[f"cores_{name.split('#')[0]}"] = (
            out.get(f"cores_{name.split('#')[0]}", 0.0) + (cpu1[name] - cpu0[name]) / wall
        )
    multi_turn = {t.name for t in job.tasks if t.max_turns > 1}
    unit_s = sorted(await unit_seconds(client, job_id, multi_turn))
    if unit_s:  # a multi-turn trajectory's time to its report: its unit's (episode's, group's) start to close
        out["unit_p50_s"] = unit_s[len(unit_s) // 2]
        out["unit_p99_s"] = unit_s[min(len(unit_s) - 1, round(0.99 * (len(unit_s) - 1)))]
    if "cores_temporal-server" in out and finished:
        out["server_cpu_ms_per_traj"] = 1000 * out["cores_temporal-server"] * wall / finished
    placement = (await handle.query("status", result_type=TrainingStatus)).placement
    if placement is not None:  # generate_pool: auto: where the tasks ended up, and how often they moved
        out["placement"] = ", ".join(f"{t} {p}" for t, p in sorted(placement.assignment.items()))
        out["placement_moves"] = placement.moves
    resets = sorted(r["end"] - r["start"] for r in timeline if r["activity"] in ("reset", "reset_group"))
    if resets:
        out["reset_p50_s"] = resets[len(resets) // 2]
        out["reset_max_s"] = resets[-1]
    return out


async def unit_seconds(client: Client, job_id: str, tasks: set[str]) -> list[float]:
    """How long each of the job's rollout workflows of `tasks` ran, start to close (one per episode or group)."""
    query = f'{JOB_ID.name} = "{job_id}" AND WorkflowType != "TrainingWorkflow" AND ExecutionStatus = "Completed"'
    return [
        (wf.close_time - wf.start_time).total_seconds()
        async for wf in client.list_workflows(query)
        if wf.close_time and wf.typed_search_attributes.get(TASK) in tasks
    ]


async def job_timeline(client: Client, job_id: str, concurrency: int = 16) -> list[dict]:
    """Every finished activity of the job's workflows: pool, type, the worker that ran it, start and end."""
    ids = [(wf.id, wf.run_id) async for wf in client.list_workflows(f'{JOB_ID.name} = "{job_id}"')]
    gate = asyncio.Semaphore(concurrency)

    async def spans(wid: str, run_id: str) -> list[dict]:
        async with gate:
            history = await client.get_workflow_handle(wid, run_id=run_id).fetch_history()
        return [
            {
                "pool": a.pool,
                "activity": a.activity_type,
                "worker": a.worker_identity,
                "start": a.started,
                "end": a.completed,
                "scheduled": a.scheduled,
                "next": a.next_command,
            }
            for a in activity_spans(history)
            if a.started and a.completed
        ]

    return [row for chunk in await asyncio.gather(*(spans(w, r) for w, r in ids)) for row in chunk]
