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

The asyncio path runs each call through temporalio's `ActivityEnvironment` (the
activity context the code expects, no server) — no queues, no histories, no
payload conversion, no processes.

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
from rollart.contracts.activities import (
    CloseInput,
    EnvOptions,
    GenerateBatchInput,
    GenerateInput,
    GroupResetInput,
    GroupStepInput,
    ResetInput,
    RewardBatchInput,
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
from rollart.client.rollout import plan_trajectories, rollout_units, run_rollout
from rollart.contracts.rollouts import TrajectoryInput, TrajectoryResult

HOME = RESULTS / ".stack-overhead"
MAX_TURNS = 8
ENV_ARGS = {"maps": "standard", "invalid_action": "noop"}  # untrained moves are no-ops: episodes play all 8 turns


def overhead_job(latency: dict[str, float], rollout_unit: str = "trajectory") -> JobSpec:
    """FrozenLake alone (standard 4x4, ≤ 8 turns, invalid moves are no-ops), with the given env latency."""
    task = frozenlake_task(latency, pool=Pool.H800, max_turns=MAX_TURNS, env_args=ENV_ARGS, rollout_unit=rollout_unit)
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
                m = await _temporal_round(client, overhead_job(latency, rollout_unit), n, seed=r)
                out.setdefault(mode("temporal", unit, lat), []).append(m)
                print(f"  repeat {r + 1}/{repeats} {mode('temporal', unit, lat):<34} {m['wall_s']:6.2f} s  trajectory "
                      f"{m['trajectory_s']:.2f} s", flush=True)  # fmt: skip
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
    return _temporal_measures(wall, [o.wall_s for o in outcomes], [o.result for o in outcomes if o.result], rows,
                              completed=sum(o.status == "completed" for o in outcomes),
                              workflow_walls=list(workflow_walls.values()))  # fmt: skip


def _temporal_measures(wall: float, walls: list[float], results: list[TrajectoryResult], rows: list[dict],
                       completed: int, workflow_walls: list[float]) -> dict:  # fmt: skip
    """Wall, trajectory time (`walls`: one per trajectory) and Temporal's overhead per activity (queue wait +
    workflow-task return), and its share: the sum over the workflows' own times (`workflow_walls`: a group's
    activities serve all its members, so a group counts once)."""
    overhead_ms = [r["wait_ms"] + r["return_ms"] for r in rows]
    return {
        "wall_s": wall, "trajectory_s": statistics.median(walls), "trajectories_per_s": len(walls) / wall,
        "completed": completed, "activities_per_trajectory": len(rows) / max(1, len(walls)),
        "activities_per_workflow": len(rows) / max(1, len(workflow_walls)),
        "turns": statistics.fmean(r.turns for r in results) if results else 0.0,
        "overhead_ms_per_activity": statistics.median(overhead_ms),
        "wait_ms": statistics.median(r["wait_ms"] for r in rows),
        "return_ms": statistics.median(r["return_ms"] for r in rows),
        "work_ms": statistics.median(r["work_ms"] for r in rows),
        "overhead_share": sum(overhead_ms) / 1000 / max(1e-9, sum(workflow_walls)),
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
            for unit, rollout_unit in UNITS.items():
                for lat, latency in LATENCIES.items():
                    m = await _plain_round(envs, gen, rewards, overhead_job(latency, rollout_unit), n, seed=r)
                    out.setdefault(mode("asyncio", unit, lat), []).append(m)
                    print(f"  repeat {r + 1}/{repeats} {mode('asyncio', unit, lat):<34} {m['wall_s']:6.2f} s  "
                          f"trajectory {m['trajectory_s']:.2f} s", flush=True)  # fmt: skip
        return out
    finally:
        await engine.shutdown()


async def _plain_round(envs, gen, rewards, job: JobSpec, n: int, seed: int) -> dict:
    """The inputs `rollart rollout` would run, each workflow's sequence as one coroutine (same units, same seeds)."""
    job_id = f"plain-{seed}-{uuid.uuid4().hex[:6]}"
    units = rollout_units(plan_trajectories(job, n, seed=seed, job_id=job_id))
    t0 = time.monotonic()
    done = await asyncio.gather(*(
        _plain_group(envs, gen, rewards, members, f"{job_id}-{first:04d}") if members[0].task.rollout_unit == "group"
        else _plain_trajectory(envs, gen, rewards, members[0], f"{job_id}-{first:04d}")
        for first, members in units
    ))  # fmt: skip
    wall = time.monotonic() - t0
    members = sum(d["members"] for d in done)
    return {
        "wall_s": wall, "trajectory_s": statistics.median(d["wall_s"] for d in done),
        "trajectories_per_s": members / wall, "completed": members,
        "activities_per_trajectory": sum(d["activities"] for d in done) / members,
        "turns": statistics.fmean(d["turns"] for d in done),
    }  # fmt: skip


async def _plain_trajectory(envs, gen, rewards, inp: TrajectoryInput, tid: str) -> dict:
    """TrajectoryWorkflow's sequence, as plain awaits: reset → (generate → step)* → reward → close."""
    t0 = time.monotonic()
    task = inp.task
    handle = await _call(envs.reset, ResetInput(env=task.env, env_args=task.env_args, seed=inp.seed, trajectory_id=tid,
                                                options=EnvOptions.of(task)))  # the latency model, as Episode.reset sends it
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
    return {"wall_s": time.monotonic() - t0, "activities": calls + 2, "members": 1, "turns": len(turns)}


async def _plain_group(envs, gen, rewards, members: list[TrajectoryInput], group_id: str) -> dict:
    """GroupEpisode's sequence, as plain awaits: reset_group → (generate_batch → step_group)* → reward_batch → close."""
    t0 = time.monotonic()
    task, seed, job_id = members[0].task, members[0].seed, members[0].job_id
    h = await _call(envs.reset_group, GroupResetInput(env=task.env, env_args=task.env_args, seed=seed,
                                                      size=len(members), group_id=group_id,
                                                      options=EnvOptions.of(task)))  # fmt: skip
    obs, turns = list(h.observations), [[] for _ in h.observations]
    done, calls = [False] * len(obs), 1
    while playing := [m for m in range(len(obs)) if not done[m] and len(turns[m]) < task.max_turns]:
        gens = await _call(gen.generate_batch, GenerateBatchInput(
            prompts=[obs[m] for m in playing], sampling=task.sampling, weights=WeightsRef(job_id=job_id, min_version=0),
            data_keys=[turn_key(job_id, f"{group_id}-{m}", len(turns[m])) for m in playing]))  # fmt: skip
        actions: list[str | None] = [None] * len(obs)
        for m, g in zip(playing, gens):
            actions[m] = g.completions[0].text
        steps = await _call(envs.step_group, GroupStepInput(session_id=h.session_id, actions=actions))
        for m in playing:
            s = steps[m]
            turns[m].append(TurnRecord(observation=obs[m], action=actions[m], env_reward=s.reward, done=s.done, info=s.info))
            obs[m], done[m] = s.observation, s.done
        calls += 2
    transcripts = [Transcript(task=task.name, seed=seed, turns=t, final_observation=o) for t, o in zip(turns, obs)]
    await _call(rewards.reward_batch, RewardBatchInput(reward=task.reward, transcripts=transcripts, reward_args=task.reward_args))
    await _call(envs.close, CloseInput(session_id=h.session_id))
    return {"wall_s": time.monotonic() - t0, "activities": calls + 2, "members": len(obs),
            "turns": statistics.fmean(len(t) for t in turns)}  # fmt: skip


# ---------------------------------------------------------------- report

COLUMNS = [("name", "path, unit, env latency", ""), ("wall_s", "wall s", ".2f"), ("speedup_vs_baseline", "vs asyncio", ".2f"),
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
    print("  - the plain loop's) / activities per workflow (a trajectory's or a group's), and its share of")
    print("  Temporal's trajectory time")
    path = write_results("overhead", rows, n=n, repeats=repeats, latency=LATENCY, max_turns=MAX_TURNS)
    png = plot_modes("overhead", rows, f"overhead: {n} FrozenLake trajectories, Temporal vs plain asyncio",
                     extra_key="trajectory_s", extra_label="median trajectory s")  # fmt: skip
    print(f"\n  written: {path}, {png}")


__all__ = ["main", "overhead_job"]
