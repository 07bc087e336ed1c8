"""Overhead: the same trajectories through Temporal against a plain asyncio loop in one process.

Both paths run the *same activity code* — `EnvActivities` (reset / step / close on
FrozenLake sessions), `GenerateActivities` (a vLLM AsyncLLM engine, in-process,
writing each turn's tokens to the store) and `RewardActivities` — on the same N
trajectories (same tasks and seeds, all started at once):

- `temporal`: one `TrajectoryWorkflow` per trajectory on the full local stack
  (dev server, a worker process each for control, cpu, h800, serverless);
- `asyncio`: one coroutine per trajectory doing reset → (generate → step)* →
  reward → close, each call run through temporalio's `ActivityEnvironment` (the
  activity context the code expects, no server) — no queues, no histories, no
  payload conversion, no processes.

At the env latency model of bench/workload.py and at zero env latency. Reports
wall time, trajectory time (median start → result), and Temporal's overhead per
activity two ways: from the histories (queue wait + workflow-task round trip,
as `python -m bench rollout` does), and as the extra trajectory time over the
plain loop divided by the activities of a trajectory; with its share of the
Temporal trajectory time.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from bench.report import RESULTS, format_table, plot_modes, summarize, write_results
from bench.rollout import activity_timings
from bench.training_run import stack_for
from bench.workload import LATENCY, NO_LATENCY, frozenlake_task
from rollart.activities.types import (
    CloseInput,
    GenerateInput,
    ResetInput,
    RewardInput,
    StepInput,
    Transcript,
    TurnRecord,
    WeightsRef,
    turn_key,
)
from rollart.infra.config import EngineConfig, JobSpec, StoreConfig
from rollart.infra.pools import Pool
from rollart.infra.temporal import connect
from rollart.workers.rollout import plan_trajectories, run_rollout
from rollart.workflows.types import TrajectoryInput

HOME = RESULTS / ".stack-overhead"
MAX_TURNS = 8
ENV_ARGS = {"maps": "standard", "invalid_action": "noop"}  # untrained moves are no-ops: episodes play all 8 turns


def overhead_job(latency: dict[str, float]) -> JobSpec:
    """FrozenLake alone (standard 4x4, ≤ 8 turns, invalid moves are no-ops), with the given env latency."""
    task = frozenlake_task(latency, pool=Pool.H800, max_turns=MAX_TURNS, env_args=ENV_ARGS)
    return JobSpec(name="bench", model_dir=HOME / "model", tasks=[task], engine=EngineConfig(max_model_len=256),
                   store=StoreConfig(path=HOME / "store"))  # fmt: skip


LATENCIES = {"latency model": LATENCY, "zero latency": NO_LATENCY}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench overhead", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="16 trajectories x 2 repeats (< 5 min)")
    parser.add_argument("-n", type=int, default=64, help="trajectories per repeat (default 64)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    n, repeats = (16, 2) if args.quick else (args.n, args.repeats)
    runs: dict[str, list[dict]] = {}
    job = overhead_job(LATENCY)
    print(f"overhead: {n} FrozenLake trajectories x {repeats} repeats; Temporal path: starting the stack ...", flush=True)
    with stack_for(job, HOME, [Pool.CONTROL, Pool.CPU, Pool.H800, Pool.SERVERLESS]) as stack:
        runs.update(asyncio.run(_temporal(stack, n, repeats)))
    print("overhead: plain asyncio path (engine in this process) ...", flush=True)
    runs.update(asyncio.run(_plain(job, n, repeats)))
    rows = []
    for lat in LATENCIES:
        pair = {f"asyncio, {lat}": runs[f"asyncio, {lat}"], f"temporal, {lat}": runs[f"temporal, {lat}"]}
        rows += summarize(pair, f"asyncio, {lat}")
    for lat in LATENCIES:  # extra trajectory time over the plain loop, per activity of a trajectory
        plain = next(r for r in rows if r["name"] == f"asyncio, {lat}")
        temporal = next(r for r in rows if r["name"] == f"temporal, {lat}")
        extra = temporal["trajectory_s"] - plain["trajectory_s"]
        temporal["extra_ms_per_activity"] = 1000 * extra / temporal["activities_per_trajectory"]
        temporal["extra_share"] = extra / temporal["trajectory_s"]
    report(rows, n, repeats)
    return 0


# ---------------------------------------------------------------- Temporal path


async def _temporal(stack, n: int, repeats: int) -> dict[str, list[dict]]:
    client = await connect(stack.temporal, stack.store)
    out: dict[str, list[dict]] = {}
    await _temporal_round(client, overhead_job(NO_LATENCY), 8, seed=999)  # warm-up: kernels compile
    for r in range(repeats):
        for lat, latency in LATENCIES.items():
            m = await _temporal_round(client, overhead_job(latency), n, seed=r)
            out.setdefault(f"temporal, {lat}", []).append(m)
            print(f"  repeat {r + 1}/{repeats} temporal, {lat:<14} {m['wall_s']:6.2f} s  trajectory "
                  f"{m['trajectory_s']:.2f} s", flush=True)  # fmt: skip
    return out


async def _temporal_round(client, job: JobSpec, n: int, seed: int) -> dict:
    job_id = f"overhead-{seed}-{uuid.uuid4().hex[:6]}"
    inputs = plan_trajectories(job, n, seed=seed, job_id=job_id)
    t0 = time.monotonic()
    outcomes = await run_rollout(client, inputs, job_id)
    wall = time.monotonic() - t0
    rows = []
    for o in outcomes:
        rows += activity_timings(await client.get_workflow_handle(o.workflow_id).fetch_history())
    overhead_ms = [r["wait_ms"] + r["return_ms"] for r in rows]
    per_traj = len(rows) / max(1, len(outcomes))
    traj_s = statistics.median(o.wall_s for o in outcomes)
    overhead_med = statistics.median(overhead_ms)
    return {
        "wall_s": wall, "trajectory_s": traj_s, "trajectories_per_s": len(outcomes) / wall,
        "completed": sum(o.status == "completed" for o in outcomes), "activities_per_trajectory": per_traj,
        "turns": statistics.fmean(o.result.turns for o in outcomes if o.result),
        "overhead_ms_per_activity": overhead_med,
        "wait_ms": statistics.median(r["wait_ms"] for r in rows),
        "return_ms": statistics.median(r["return_ms"] for r in rows),
        "work_ms": statistics.median(r["work_ms"] for r in rows),
        "overhead_share": sum(overhead_ms) / 1000 / max(1e-9, sum(o.wall_s for o in outcomes)),
    }  # fmt: skip


# ---------------------------------------------------------------- plain asyncio path


async def _call(fn, arg):
    """Run one activity method with an activity context of its own (unique id: vLLM request ids differ)."""
    from temporalio.testing import ActivityEnvironment

    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, activity_id=uuid.uuid4().hex, workflow_id="plain")
    return await env.run(fn, arg)


async def _plain(job: JobSpec, n: int, repeats: int) -> dict[str, list[dict]]:
    from rollart.activities.engines.factory import create_engine
    from rollart.activities.env import EnvActivities
    from rollart.activities.generate import GenerateActivities
    from rollart.activities.reward import RewardActivities
    from rollart.infra.store import open_store

    engine = create_engine(job.model_dir, job.engine)
    await engine.start()
    try:
        weights_dir = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
        gen = GenerateActivities(engine, open_store(job.store), "plain", weights_dir, job.model_dir / "model.safetensors")
        envs, rewards = EnvActivities("plain", queue="plain"), RewardActivities()
        await _plain_round(envs, gen, rewards, overhead_job(NO_LATENCY), 8, seed=999)  # warm-up
        out: dict[str, list[dict]] = {}
        for r in range(repeats):
            for lat, latency in LATENCIES.items():
                m = await _plain_round(envs, gen, rewards, overhead_job(latency), n, seed=r)
                out.setdefault(f"asyncio, {lat}", []).append(m)
                print(f"  repeat {r + 1}/{repeats} asyncio, {lat:<14} {m['wall_s']:6.2f} s  trajectory "
                      f"{m['trajectory_s']:.2f} s", flush=True)  # fmt: skip
        return out
    finally:
        await engine.shutdown()


async def _plain_round(envs, gen, rewards, job: JobSpec, n: int, seed: int) -> dict:
    job_id = f"plain-{seed}-{uuid.uuid4().hex[:6]}"
    inputs = plan_trajectories(job, n, seed=seed, job_id=job_id)
    t0 = time.monotonic()
    done = await asyncio.gather(*(_plain_trajectory(envs, gen, rewards, inp, f"{job_id}-{i:04d}")
                                  for i, inp in enumerate(inputs)))  # fmt: skip
    wall = time.monotonic() - t0
    return {
        "wall_s": wall, "trajectory_s": statistics.median(d["wall_s"] for d in done),
        "trajectories_per_s": len(done) / wall, "completed": len(done),
        "activities_per_trajectory": statistics.fmean(d["activities"] for d in done),
        "turns": statistics.fmean(d["turns"] for d in done),
    }  # fmt: skip


async def _plain_trajectory(envs, gen, rewards, inp: TrajectoryInput, tid: str) -> dict:
    """TrajectoryWorkflow's sequence, as plain awaits: reset → (generate → step)* → reward → close."""
    t0 = time.monotonic()
    task = inp.task
    handle = await _call(envs.reset, ResetInput(env=task.env, env_args=task.env_args, seed=inp.seed, trajectory_id=tid))
    observation, turns, done, calls = handle.observation, [], False, 1
    while not done and len(turns) < task.max_turns:
        g = await _call(gen.generate, GenerateInput(prompt=observation, sampling=task.sampling,
                                                    data_key=turn_key(inp.job_id, tid, len(turns)),
                                                    weights=WeightsRef(job_id=inp.job_id, min_version=0)))  # fmt: skip
        action = g.completions[0].text
        s = await _call(envs.step, StepInput(session_id=handle.session_id, action=action))
        turns.append(TurnRecord(observation=observation, action=action, env_reward=s.reward, done=s.done, info=s.info))
        observation, done, calls = s.observation, s.done, calls + 2
    transcript = Transcript(task=task.name, seed=inp.seed, turns=turns, final_observation=observation)
    await _call(rewards.reward, RewardInput(reward=task.reward, transcript=transcript))
    await _call(envs.close, CloseInput(session_id=handle.session_id))
    return {"wall_s": time.monotonic() - t0, "activities": calls + 2, "turns": len(turns)}


# ---------------------------------------------------------------- report

COLUMNS = [("name", "path, env latency", ""), ("wall_s", "wall s", ".2f"), ("speedup_vs_baseline", "vs asyncio", ".2f"),
           ("trajectories_per_s", "traj/s", ".1f"), ("trajectory_s", "trajectory s", ".2f"),
           ("activities_per_trajectory", "act/traj", ".1f"), ("work_ms", "work ms", ".1f"),
           ("wait_ms", "wait ms", ".1f"), ("return_ms", "return ms", ".1f"),
           ("overhead_ms_per_activity", "overhead ms/act", ".1f"), ("overhead_share", "share", ".0%"),
           ("extra_ms_per_activity", "extra ms/act", ".1f"), ("extra_share", "extra share", ".0%")]  # fmt: skip


def report(rows: list[dict], n: int, repeats: int) -> None:
    print(f"\noverhead: {n} FrozenLake trajectories (standard 4x4, {MAX_TURNS} turns, invalid moves no-ops), "
          f"all started at once, medians of {repeats} repeats")  # fmt: skip
    print(format_table(rows, COLUMNS))
    print("  vs asyncio = the plain loop's wall / this path's, at the same env latency (< 1: Temporal is slower)")
    print("  overhead ms/act = median (queue wait + workflow-task return) per activity, from the histories;")
    print("  share = the sum of those over the sum of trajectory times; extra = (Temporal's median trajectory time")
    print("  - the plain loop's) / activities per trajectory, and its share of Temporal's trajectory time")
    path = write_results("overhead", rows, n=n, repeats=repeats, latency=LATENCY, max_turns=MAX_TURNS)
    png = plot_modes("overhead", rows, f"overhead: {n} FrozenLake trajectories, Temporal vs plain asyncio",
                     extra_key="trajectory_s", extra_label="median trajectory s")  # fmt: skip
    print(f"\n  written: {path}, {png}")


__all__ = ["main", "overhead_job"]
