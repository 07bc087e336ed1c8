"""`python -m bench overhead --generate-s S`: Temporal's overhead where a generation takes as long as a real model's.

The tiny model answers in milliseconds, so the plain `overhead` run measures Temporal against calls that cost
almost nothing. Here every generation takes a fixed `S` seconds (1 s is the order of a 7B model's turn on a
GPU) and env resets and steps take the env latency model's time (bench/workload.py): the stand-in activities of
bench/scale_standins.py, the same object on both paths.

- `temporal`: `rollart rollout`'s path, a workflow per unit on a dev server with the real control worker;
  every other activity is a stand-in in one separate process;
- `asyncio`: the same rollout driver over in-process calls to the same stand-ins, one coroutine per unit.

Units: episodes (a TrajectoryWorkflow each), lockstep groups of 8 and groups of 8 whose members play free of
lockstep (`group_play: free`), all started at once. Reports wall time, the ratio to the plain loop, median
trajectory time and activities per trajectory.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

from bench.report import RESULTS, format_table, summarize, write_results
from bench.scale_standins import EnvLatencyStandIns
from bench.training_run import REPO, stack_for
from bench.workload import LATENCY, frozenlake_task
from rollart.client.in_process import InProcessCalls, play_unit
from rollart.client.rollout import plan_trajectories, rollout_units, run_rollout
from rollart.infra.temporal.connection import connect
from rollart.spec.config import JobSpec, StoreConfig
from rollart.spec.pools import Pool

__all__ = ["UNITS", "run"]

HOME = RESULTS / ".stack-overhead-generate"
MAX_TURNS = 8
UNITS: dict[str, dict[str, str]] = {
    "episodes": {"rollout_unit": "trajectory"},
    "groups": {"rollout_unit": "group", "group_play": "lockstep"},
    "free members": {"rollout_unit": "group", "group_play": "free"},
}
"""How a trajectory's calls are made: its own workflow, its group's lockstep turns, or its own inside its group's."""


def job_of(unit: str) -> JobSpec:
    """FrozenLake-shaped episodes of MAX_TURNS turns (the stand-in env ends them there), groups of 8."""
    task = frozenlake_task(LATENCY, pool=Pool.H800, max_turns=MAX_TURNS, **UNITS[unit])
    return JobSpec(name="bench", model_dir=HOME / "model", tasks=[task], store=StoreConfig(path=HOME / "store"))


def run(n: int, repeats: int, generate_s: float) -> int:
    """Both paths, every unit, `repeats` rounds each; prints and writes bench/results/overhead-generate.json."""
    runs: dict[str, list[dict]] = {}
    print(
        f"overhead --generate-s {generate_s}: {n} trajectories x {repeats} repeats; starting the stack ...", flush=True
    )
    with stack_for(job_of("episodes"), HOME, [Pool.CONTROL]) as stack:
        cmd = [sys.executable, "-m", "bench.scale_standins", stack.address, "--store", str(HOME / "store")]
        cmd += ["--generate-s", str(generate_s), "--turns", str(MAX_TURNS)]
        standins = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
        try:
            if standins.stdout is None or standins.stdout.readline().strip() != "READY":
                raise RuntimeError(f"the stand-in activity process did not start (exit {standins.poll()})")
            runs |= asyncio.run(_temporal(stack, n, repeats))
        finally:
            standins.terminate()
            standins.wait(30)
    runs |= asyncio.run(_plain(n, repeats, generate_s))
    rows = []
    for unit in UNITS:
        rows += summarize(
            {f"asyncio, {unit}": runs[f"asyncio, {unit}"], f"temporal, {unit}": runs[f"temporal, {unit}"]},
            f"asyncio, {unit}",
        )
    report(rows, n, repeats, generate_s)
    return 0


async def _temporal(stack: Any, n: int, repeats: int) -> dict[str, list[dict]]:
    client = await connect(stack.temporal, stack.store)
    out: dict[str, list[dict]] = {}
    for r in range(repeats):
        for unit in UNITS:
            job_id = f"overhead-gen-{r}-{uuid.uuid4().hex[:6]}"
            inputs = plan_trajectories(job_of(unit), n, seed=r, job_id=job_id)
            t0 = time.monotonic()
            outcomes = await run_rollout(client, inputs, job_id)
            wall = time.monotonic() - t0
            results = [o.result for o in outcomes if o.result]
            m = _measures(wall, [o.wall_s for o in outcomes], sum(r.status == "completed" for r in results))
            out.setdefault(f"temporal, {unit}", []).append(m)
            _progress(r, repeats, f"temporal, {unit}", m)
    return out


async def _plain(n: int, repeats: int, generate_s: float) -> dict[str, list[dict]]:
    standins = EnvLatencyStandIns(turns=MAX_TURNS, turn_delay_s=generate_s)
    standins._record = lambda *_: None  # type: ignore[method-assign]  # nothing reads the calls here
    calls = InProcessCalls.of(standins)
    out: dict[str, list[dict]] = {}
    for r in range(repeats):
        for unit in UNITS:
            job_id = f"plain-gen-{r}-{uuid.uuid4().hex[:6]}"
            units = rollout_units(plan_trajectories(job_of(unit), n, seed=r, job_id=job_id))
            before = sum(calls.counts.values())
            t0 = time.monotonic()

            async def timed(first: int, members: list) -> tuple[float, list]:
                results = await play_unit(calls, first, members, job_id)  # noqa: B023 - awaited in this iteration
                return time.monotonic() - t0, results  # noqa: B023

            done = await asyncio.gather(*(timed(first, members) for first, members in units))
            wall = time.monotonic() - t0
            walls = [w for w, rs in done for _ in rs]
            m = _measures(wall, walls, sum(r.status == "completed" for _, rs in done for r in rs))
            m["activities_per_trajectory"] = (sum(calls.counts.values()) - before) / len(walls)
            out.setdefault(f"asyncio, {unit}", []).append(m)
            _progress(r, repeats, f"asyncio, {unit}", m)
    return out


def _measures(wall: float, walls: list[float], completed: int) -> dict[str, float]:
    """Wall time, and each trajectory's time to its result (a group's members share their group's)."""
    return {
        "wall_s": wall,
        "trajectory_s": statistics.median(walls),
        "trajectories_per_s": len(walls) / wall,
        "completed": completed,
        "failed": len(walls) - completed,
    }


def _progress(r: int, repeats: int, name: str, m: dict[str, float]) -> None:
    print(
        f"  repeat {r + 1}/{repeats} {name:<24} {m['wall_s']:6.2f} s  trajectory {m['trajectory_s']:.2f} s", flush=True
    )


COLUMNS = [
    ("name", "path, unit", ""),
    ("wall_s", "wall s", ".2f"),
    ("speedup_vs_baseline", "vs asyncio", ".2f"),
    ("trajectories_per_s", "traj/s", ".1f"),
    ("trajectory_s", "trajectory s", ".2f"),
    ("completed", "completed", ".0f"),
]


def report(rows: list[dict], n: int, repeats: int, generate_s: float) -> None:
    print(
        f"\noverhead --generate-s {generate_s}: {n} stand-in trajectories ({MAX_TURNS} turns, each generation "
        f"{generate_s} s, env latency model), all started at once, medians of {repeats} repeats"
    )
    print(format_table(rows, COLUMNS))
    print("  vs asyncio = the plain loop's wall / the Temporal path's, same unit (< 1: Temporal is slower)")
    path = write_results(
        "overhead-generate", rows, n=n, repeats=repeats, generate_s=generate_s, latency=LATENCY, max_turns=MAX_TURNS
    )
    print(f"\n  written: {path}")
