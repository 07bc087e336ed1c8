"""Overhead: the same trajectories through Temporal against a plain asyncio loop in one process.

Both paths run the *same activity code* — `EnvActivities` (reset / step / close on
FrozenLake sessions), `GenerateActivities` (a vLLM AsyncLLM engine, in-process,
writing each turn's tokens to the store) and `RewardActivities` — on the same N
trajectories (all started at once), in two units:

- episodes — `temporal`: one `TrajectoryWorkflow` per trajectory on the full
  local stack (dev server, a worker process each for control, cpu, h800,
  serverless); `asyncio`: one coroutine per trajectory doing reset → (generate →
  step)* → reward → close;
- groups of 8 — `temporal`: one `GroupRolloutWorkflow` per group; `asyncio`: one
  coroutine per group doing reset_group → (generate_batch → step_group)* →
  reward_batch → close.

The asyncio path is the same rollout driver (workflows/driver) over in-process
calls (`rollart.client.in_process`, `rollart eval`'s path): each activity runs in
an activity context of its own, no server — no queues, no histories, no payload
conversion, no processes.

At the env latency model of bench/workload.py and at zero env latency. Reports
wall time, trajectory time (median start → result), and Temporal's overhead per
activity two ways: from the histories (queue wait + workflow-task round trip,
as `python -m bench rollout` does), and as the extra trajectory time over the
plain loop divided by the activities of one workflow (a trajectory's, or a
group's, whose time is each member's); with its share of the Temporal
trajectory time.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

from bench import overhead_standins
from bench.report import RESULTS, format_table, plot_modes, summarize, write_results
from bench.rollout import activity_timings, cpu_seconds
from bench.training_run import stack_for
from bench.workload import LATENCY, NO_LATENCY, frozenlake_task
from rollart.client.in_process import InProcessCalls, in_process_activities, play_unit, started_engine
from rollart.client.rollout import plan_trajectories, rollout_units, run_rollout
from rollart.contracts.rollouts import TrajectoryResult
from rollart.infra.temporal.connection import connect
from rollart.spec.config import EngineConfig, JobSpec, StoreConfig
from rollart.spec.pools import Pool

HOME = RESULTS / ".stack-overhead"
MAX_TURNS = 8
ENV_ARGS = {"maps": "standard", "invalid_action": "noop"}  # untrained moves are no-ops: episodes play all 8 turns


def overhead_job(latency: dict[str, float], rollout_unit: str = "trajectory") -> JobSpec:
    """FrozenLake alone (standard 4x4, ≤ 8 turns, invalid moves are no-ops), with the given env latency."""
    task = frozenlake_task(latency, pool=Pool.H800, max_turns=MAX_TURNS, env_args=ENV_ARGS, rollout_unit=rollout_unit)
    return JobSpec(
        name="bench",
        model_dir=HOME / "model",
        tasks=[task],
        engine=EngineConfig(max_model_len=256),
        store=StoreConfig(path=HOME / "store"),
    )


LATENCIES = {"latency model": LATENCY, "zero latency": NO_LATENCY}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench overhead", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="16 trajectories x 2 repeats (< 5 min)")
    parser.add_argument("-n", type=int, default=64, help="trajectories per repeat (default 64)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--generate-s",
        type=float,
        default=None,
        help="every generation takes this long (stand-in activities, bench/overhead_standins.py): Temporal's "
        "overhead at a real model's turn time, for episodes, lockstep groups and free members",
    )
    args = parser.parse_args(argv)
    n, repeats = (16, 2) if args.quick else (args.n, args.repeats)
    if args.generate_s is not None:
        return overhead_standins.run(n, repeats, args.generate_s)
    runs: dict[str, list[dict]] = {}
    job = overhead_job(LATENCY)
    print(
        f"overhead: {n} FrozenLake trajectories x {repeats} repeats; Temporal path: starting the stack ...", flush=True
    )
    with stack_for(job, HOME, [Pool.CONTROL, Pool.CPU, Pool.H800, Pool.SERVERLESS]) as stack:
        runs.update(asyncio.run(_temporal(stack, n, repeats)))
    print("overhead: plain asyncio path (engine in this process) ...", flush=True)
    runs.update(asyncio.run(_plain(job, n, repeats)))
    rows = []
    for unit in UNITS:
        for lat in LATENCIES:
            plain, temporal = mode("asyncio", unit, lat), mode("temporal", unit, lat)
            pair = summarize({plain: runs[plain], temporal: runs[temporal]}, plain)
            extra = pair[1]["trajectory_s"] - pair[0]["trajectory_s"]  # over the activities of one workflow:
            pair[1]["extra_ms_per_activity"] = 1000 * extra / pair[1]["activities_per_workflow"]
            pair[1]["extra_share"] = extra / pair[1]["trajectory_s"]
            rows += pair
    report(rows, n, repeats)
    return 0


UNITS = {"episodes": "trajectory", "groups": "group"}
"""How a trajectory's calls are made: an activity per episode and phase (TrajectoryWorkflow), or per group of 8
and phase (GroupRolloutWorkflow: reset_group, generate_batch and step_group per turn, reward_batch)."""


def mode(path: str, unit: str, latency: str) -> str:
    """A row's name: `temporal, groups, latency model`."""
    return f"{path}, {unit}, {latency}"


# ---------------------------------------------------------------- Temporal path


async def _temporal(stack, n: int, repeats: int) -> dict[str, list[dict]]:
    client = await connect(stack.temporal, stack.store)
    out: dict[str, list[dict]] = {}
    await _temporal_round(client, overhead_job(NO_LATENCY), 8, seed=999)  # warm-up: kernels compile
    for r in range(repeats):
        for unit, rollout_unit in UNITS.items():
            for lat, latency in LATENCIES.items():
                cpu0 = cpu_seconds(stack)
                m = await _temporal_round(client, overhead_job(latency, rollout_unit), n, seed=r)
                m |= _cpu_per_activity(cpu0, cpu_seconds(stack), m["activities"])
                out.setdefault(mode("temporal", unit, lat), []).append(m)
                print(
                    f"  repeat {r + 1}/{repeats} {mode('temporal', unit, lat):<34} {m['wall_s']:6.2f} s  trajectory "
                    f"{m['trajectory_s']:.2f} s",
                    flush=True,
                )
    return out


async def _temporal_round(client, job: JobSpec, n: int, seed: int) -> dict:
    """`rollart rollout`'s path: a TrajectoryWorkflow per episode, or a GroupRolloutWorkflow per group."""
    job_id = f"overhead-{seed}-{uuid.uuid4().hex[:6]}"
    inputs = plan_trajectories(job, n, seed=seed, job_id=job_id)
    t0 = time.monotonic()
    outcomes = await run_rollout(client, inputs, job_id)
    wall = time.monotonic() - t0
    workflow_walls = {o.workflow_id: o.wall_s for o in outcomes}  # a group's members share their workflow's
    rows = []
    for workflow_id in workflow_walls:
        rows += activity_timings(await client.get_workflow_handle(workflow_id).fetch_history())
    return _temporal_measures(
        wall,
        [o.wall_s for o in outcomes],
        [o.result for o in outcomes if o.result],
        rows,
        completed=sum(o.status == "completed" for o in outcomes),
        workflow_walls=list(workflow_walls.values()),
    )


def _cpu_per_activity(before: dict[str, float], after: dict[str, float], activities: int) -> dict[str, float]:
    """CPU ms per activity of the Temporal server and of the control worker (workflow tasks) over one round: what
    orchestration costs, read from the processes rather than the clock, so less sensitive to a busy machine."""
    used = {k: after[k] - before.get(k, 0.0) for k in after}
    control = sum(v for k, v in used.items() if k.startswith(f"{Pool.CONTROL.value}#"))
    return {
        "server_cpu_ms_per_activity": 1000 * used.get("temporal-server", 0.0) / max(1, activities),
        "control_cpu_ms_per_activity": 1000 * control / max(1, activities),
    }


def _temporal_measures(
    wall: float,
    walls: list[float],
    results: list[TrajectoryResult],
    rows: list[dict],
    completed: int,
    workflow_walls: list[float],
) -> dict:
    """Wall, trajectory time (`walls`: one per trajectory) and Temporal's overhead per activity (queue wait +
    workflow-task return), and its share: the sum over the workflows' own times (`workflow_walls`: a group's
    activities serve all its members, so a group counts once)."""
    overhead_ms = [r["wait_ms"] + r["return_ms"] for r in rows]
    return {
        "wall_s": wall,
        "trajectory_s": statistics.median(walls),
        "trajectories_per_s": len(walls) / wall,
        "completed": completed,
        "activities": len(rows),
        "activities_per_trajectory": len(rows) / max(1, len(walls)),
        "activities_per_workflow": len(rows) / max(1, len(workflow_walls)),
        "turns": statistics.fmean(r.turns for r in results) if results else 0.0,
        "overhead_ms_per_activity": statistics.median(overhead_ms),
        "wait_ms": statistics.median(r["wait_ms"] for r in rows),
        "return_ms": statistics.median(r["return_ms"] for r in rows),
        "work_ms": statistics.median(r["work_ms"] for r in rows),
        "overhead_share": sum(overhead_ms) / 1000 / max(1e-9, sum(workflow_walls)),
    }


# ---------------------------------------------------------------- plain asyncio path


async def _plain(job: JobSpec, n: int, repeats: int) -> dict[str, list[dict]]:
    """The rollout driver over the same activity code in this process (`rollart eval`'s path), engine and all."""
    async with started_engine(job.model_dir, job.engine) as engine:
        async with in_process_activities(engine, job.model_dir, job.store) as calls:
            await _plain_round(calls, overhead_job(NO_LATENCY), 8, seed=999)  # warm-up
            out: dict[str, list[dict]] = {}
            for r in range(repeats):
                for unit, rollout_unit in UNITS.items():
                    for lat, latency in LATENCIES.items():
                        m = await _plain_round(calls, overhead_job(latency, rollout_unit), n, seed=r)
                        out.setdefault(mode("asyncio", unit, lat), []).append(m)
                        print(
                            f"  repeat {r + 1}/{repeats} {mode('asyncio', unit, lat):<34} {m['wall_s']:6.2f} s  "
                            f"trajectory {m['trajectory_s']:.2f} s",
                            flush=True,
                        )
            return out


async def _plain_round(calls: InProcessCalls, job: JobSpec, n: int, seed: int) -> dict:
    """The units `rollart rollout` would start, each played by the driver as one coroutine (same seeds)."""
    job_id = f"plain-{seed}-{uuid.uuid4().hex[:6]}"
    units = rollout_units(plan_trajectories(job, n, seed=seed, job_id=job_id))
    before = sum(calls.counts.values())
    t0 = time.monotonic()

    async def timed(first: int, members: list) -> tuple[float, list[TrajectoryResult]]:
        results = await play_unit(calls, first, members, job_id)
        return time.monotonic() - t0, results

    done = await asyncio.gather(*(timed(first, members) for first, members in units))
    wall = time.monotonic() - t0
    results = [r for _, rs in done for r in rs]
    return {
        "wall_s": wall,
        "trajectory_s": statistics.median(w for w, _ in done),
        "trajectories_per_s": len(results) / wall,
        "completed": sum(r.status == "completed" for r in results),
        "activities_per_trajectory": (sum(calls.counts.values()) - before) / len(results),
        "turns": statistics.fmean(r.turns for r in results),
    }


# ---------------------------------------------------------------- report

COLUMNS = [
    ("name", "path, unit, env latency", ""),
    ("wall_s", "wall s", ".2f"),
    ("speedup_vs_baseline", "vs asyncio", ".2f"),
    ("trajectories_per_s", "traj/s", ".1f"),
    ("trajectory_s", "trajectory s", ".2f"),
    ("activities_per_trajectory", "act/traj", ".1f"),
    ("work_ms", "work ms", ".1f"),
    ("wait_ms", "wait ms", ".1f"),
    ("return_ms", "return ms", ".1f"),
    ("overhead_ms_per_activity", "overhead ms/act", ".1f"),
    ("overhead_share", "share", ".0%"),
    ("server_cpu_ms_per_activity", "server cpu ms/act", ".1f"),
    ("control_cpu_ms_per_activity", "control cpu ms/act", ".1f"),
    ("extra_ms_per_activity", "extra ms/act", ".1f"),
    ("extra_share", "extra share", ".0%"),
]


def report(rows: list[dict], n: int, repeats: int) -> None:
    print(
        f"\noverhead: {n} FrozenLake trajectories (standard 4x4, {MAX_TURNS} turns, invalid moves no-ops), "
        f"all started at once, medians of {repeats} repeats"
    )
    print(format_table(rows, COLUMNS))
    print("  vs asyncio = the plain loop's wall / this path's, at the same env latency (< 1: Temporal is slower)")
    print("  overhead ms/act = median (queue wait + workflow-task return) per activity, from the histories;")
    print("  share = the sum of those over the sum of trajectory times; extra = (Temporal's median trajectory time")
    print("  - the plain loop's) / activities per workflow (a trajectory's or a group's), and its share of")
    print("  Temporal's trajectory time; cpu ms/act = CPU the Temporal server and the control worker used per activity")
    path = write_results("overhead", rows, n=n, repeats=repeats, latency=LATENCY, max_turns=MAX_TURNS)
    png = plot_modes(
        "overhead",
        rows,
        f"overhead: {n} FrozenLake trajectories, Temporal vs plain asyncio",
        extra_key="trajectory_s",
        extra_label="median trajectory s",
    )
    print(f"\n  written: {path}, {png}")


__all__ = ["main", "overhead_job"]
