"""Reward-as-a-Service: the same rollout load with a reward model, colocated with generation vs serverless.

One local stack (dev server + a worker process per pool, vLLM on the CPU) runs N FrozenLake
trajectories per round, colocated and serverless rounds alternating R times, every trajectory
scored by the `reward_model` reward (a byte-level transformer whose forward passes cost real
CPU time; `--reward-ms` sets how much):

- colocated: `reward_placement: colocated`, the reward runs on the h800 worker beside the
  vLLM engine and competes with it (the monolithic baseline);
- serverless: the reward runs on the elastic "serverless" pool, scaled by the autoscaler.

With `--pin` (the default) the machine is split as the paper's cluster is: the generation
worker gets core 1 to itself (its "GPU"), everything else (Temporal, workflows, envs, the
serverless pool) shares core 0. Without it every process shares both cores. From the workflow
histories: mean rollout time (start → result per trajectory), trajectories/s, and the engine's
busy fraction (share of the wall time in which at least one `generate` ran).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

import psutil
from temporalio.client import Client

from bench.report import RESULTS, plot_modes
from bench.rollout import activity_timings
from rollart.client.rollout import plan_trajectories, run_rollout
from rollart.infra.local.devserver import free_port
from rollart.infra.temporal.connection import connect
from rollart.infra.temporal.history import busy_seconds
from rollart.infra.tiny_model import ensure_tiny_model
from rollart.spec.config import EngineConfig, JobSpec, StoreConfig, TaskSpec
from rollart.spec.pools import Pool
from rollart.workers.local_stack import LocalStack, pools_for_job

MODES = ("colocated", "serverless")
PAPER = {
    "colocated_rollout_s": 158.0,
    "serverless_rollout_s": 77.0,
    "gpu_util_colocated": 0.06,
    "gpu_util_serverless": 0.88,
}


def bench_job(home: Path, reward_args: dict) -> JobSpec:
    """The default example's task (standard 4x4 map, ≤ 8 turns, groups of 8) scored by the reward model, twice:
    one task per placement, so both modes run on one stack (the h800 worker serves the colocated rewards)."""
    tasks = [
        TaskSpec(
            name=mode,
            env="frozenlake",
            env_args={"maps": "standard"},
            reward="reward_model",
            reward_args=reward_args,
            reward_placement=mode,
            generate_pool=Pool.H800,
            max_turns=8,
            group_size=8,
        )
        for mode in MODES
    ]
    pools = {
        "serverless": {
            "min_workers": 1,
            "max_workers": 2,
            "max_concurrent_activities": 2,
            "scale_up_cooldown_s": 6,
            "scale_down_cooldown_s": 30,
        }
    }
    return JobSpec(
        name="bench-reward",
        model_dir=home / "model",
        tasks=tasks,
        pools=pools,
        engine=EngineConfig(max_model_len=256),
        store=StoreConfig(path=home / "store"),
    )


def one_task(job: JobSpec, mode: str) -> JobSpec:
    """The job with only `mode`'s task: what one round rolls out."""
    return job.model_copy(update={"tasks": [job.task(mode)]})


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


def pin(pids: list[int], cores: set[int]) -> None:
    """Set the CPU affinity of every thread of these processes and their children (new threads inherit it)."""
    for pid in pids:
        try:
            tree = [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
        except psutil.NoSuchProcess:
            continue
        for p in tree:
            for tid in _threads(p):
                try:
                    os.sched_setaffinity(tid, cores)
                except (ProcessLookupError, PermissionError):
                    pass


def cpu_seconds(stack: LocalStack) -> dict[tuple[str, int], float]:
    """CPU seconds (user + system) used so far per process (with its children), keyed by (pool, pid)."""
    pids = [(name.split("#")[0], pid) for name, pid in stack.worker_pids().items()]
    if stack.server and stack.server.pid:
        pids.append(("temporal-server", stack.server.pid))
    used: dict[tuple[str, int], float] = {}
    for key in pids:
        try:
            p = psutil.Process(key[1])
            used[key] = sum(sum(q.cpu_times()[:2]) for q in [p, *p.children(recursive=True)])
        except psutil.NoSuchProcess:  # an elastic worker that drained and exited
            pass
    return used


def cpu_share(
    before: dict[tuple[str, int], float], after: dict[tuple[str, int], float], wall: float
) -> dict[str, float]:
    """Cores used per pool over a round; an elastic worker that exited during it is not counted (a lower bound)."""
    share: dict[str, float] = {}
    for (pool, pid), t in after.items():
        share[pool] = share.get(pool, 0.0) + (t - before.get((pool, pid), 0.0)) / wall
    return share


def pin_stack(stack: LocalStack) -> None:
    """Generation worker → core 1; server, other workers and this process (which spawns elastic workers) → core 0."""
    gen = [pid for name, pid in stack.worker_pids().items() if name.startswith(("h800", "h20"))]
    rest = [pid for name, pid in stack.worker_pids().items() if not name.startswith(("h800", "h20"))]
    if stack.server and stack.server.pid:
        rest.append(stack.server.pid)
    pin(gen, {1})
    pin([*rest, os.getpid()], {0})


async def one_round(client: Client, stack: LocalStack, job: JobSpec, n: int, seed: int) -> dict:
    job_id = f"{job.name}-{seed}-{int(time.time())}"
    inputs = plan_trajectories(job, n, seed=seed, job_id=job_id)
    cpu0 = cpu_seconds(stack)
    t0 = time.time()
    outcomes = await run_rollout(client, inputs, job_id)
    t1 = time.time()
    wall = t1 - t0
    cpu1 = cpu_seconds(stack)
    rows: list[dict] = []
    for workflow_id in dict.fromkeys(o.workflow_id for o in outcomes):  # a group's members share one
        rows += activity_timings(await client.get_workflow_handle(workflow_id).fetch_history())
    gens = [(r["start"], r["end"]) for r in rows if r["type"] == "generate"]
    rewards = [r for r in rows if r["type"] == "reward"]
    done = [o for o in outcomes if o.status == "completed"]
    return {
        "wall_s": wall,
        "completed": len(done),
        "mean_rollout_s": statistics.fmean(o.wall_s for o in outcomes),
        "trajectories_per_s": len(outcomes) / wall,
        "engine_busy_fraction": busy_seconds(gens) / wall,
        "tokens_per_s": sum(o.result.completion_tokens for o in done if o.result) / wall,
        "generate_work_ms": statistics.median(r["work_ms"] for r in rows if r["type"] == "generate"),
        "reward_work_ms": statistics.median(r["work_ms"] for r in rewards) if rewards else float("nan"),
        "reward_wait_ms": statistics.median(r["wait_ms"] for r in rewards) if rewards else float("nan"),
        "reward_queues": sorted({r["queue"] for r in rewards}),
        "cpu_share": cpu_share(cpu0, cpu1, wall),
    }


async def run_rounds(stack: LocalStack, job: JobSpec, n: int, repeats: int, pinned: bool) -> dict[str, list[dict]]:
    """Warm both modes up, then alternate colocated and serverless rounds (drift on a shared machine hits both)."""
    client = await connect(stack.temporal, job.store)
    if pinned:
        pin_stack(stack)
    for mode in MODES:  # kernels compile, each placement loads its reward model
        await one_round(client, stack, one_task(job, mode), 8, seed=999)
    rounds: dict[str, list[dict]] = {m: [] for m in MODES}
    for i in range(repeats):
        for mode in MODES:
            if pinned:
                pin_stack(stack)  # workers the autoscaler started since
            await asyncio.sleep(2.0)  # let the previous round's stragglers settle
            rounds[mode].append(await one_round(client, stack, one_task(job, mode), n, seed=i))
    return rounds


def measure(home: Path, n: int, repeats: int, reward_args: dict, pinned: bool) -> list[dict]:
    job = bench_job(home, reward_args)
    ensure_tiny_model(job.model_dir)
    stack = LocalStack(job=job, pools=pools_for_job(job), home=home, port=free_port(), ui_port=None)
    affinity = os.sched_getaffinity(0)
    try:
        with stack:
            rounds = asyncio.run(run_rounds(stack, job, n, repeats, pinned))
            scaler = stack.autoscaler()
            t0 = scaler.events[0].at if scaler and scaler.events else 0.0
            events = [{"t": e.at - t0, "kind": e.kind, "detail": e.detail} for e in scaler.events] if scaler else []
    finally:
        pin([os.getpid()], affinity)
    keys = (
        "wall_s",
        "mean_rollout_s",
        "trajectories_per_s",
        "engine_busy_fraction",
        "tokens_per_s",
        "generate_work_ms",
        "reward_work_ms",
        "reward_wait_ms",
    )
    modes = []
    for mode in MODES:
        rs = rounds[mode]
        med = {k: statistics.median(r[k] for r in rs) for k in keys}
        cpu = {k: statistics.median(r["cpu_share"].get(k, 0.0) for r in rs) for k in rs[0]["cpu_share"]}
        modes.append(
            {
                "name": mode,
                **med,
                "rounds": rs,
                "cpu_cores": cpu,
                "reward_queues": rs[0]["reward_queues"],
                "autoscaler_events": events if mode == "serverless" else [],
            }
        )
    return modes


def calibrate(reward_args: dict) -> float:
    """Milliseconds of one forward pass of the reward model over an 8-turn FrozenLake transcript (median of 7)."""
    from rollart.contracts.activities import Transcript, TurnRecord
    from rollart.spec.registry import lookup_reward

    grid = "SFFF\nFHFH\nFFFH\nHFFG\nmove:"
    t = Transcript(task="frozenlake", seed=0, turns=[TurnRecord(observation=grid, action="R")] * 8)
    model = lookup_reward("reward_model").load(reward_args)  # what a serverless worker loads
    model(t)
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        model(t)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench reward_service", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="16 trajectories, 1 round per mode")
    parser.add_argument("-n", type=int, default=64, help="trajectories per repeat (default 64)")
    parser.add_argument("--repeats", type=int, default=3, help="alternating rounds per mode (default 3)")
    parser.add_argument("--hidden", type=int, default=128, help="reward model width (default 128)")
    parser.add_argument("--layers", type=int, default=2, help="reward model layers (default 2)")
    parser.add_argument(
        "--reward-ms",
        type=float,
        default=400.0,
        help="calibrate forward passes so one scored trajectory costs about this much CPU time, "
        "measured here before the stacks start (default 400)",
    )
    parser.add_argument("--passes", type=int, help="forward passes per scored trajectory (overrides --reward-ms)")
    parser.add_argument(
        "--no-pin",
        dest="pin",
        action="store_false",
        help="let every process use both cores (default: generation alone on core 1)",
    )
    args = parser.parse_args(argv)
    n, repeats = (16, 1) if args.quick else (args.n, args.repeats)
    pinned = args.pin and len(os.sched_getaffinity(0)) >= 2
    reward_args: dict = {"hidden": args.hidden, "layers": args.layers, "passes": 1}
    one_pass_ms = calibrate(reward_args)
    passes = args.passes or max(1, round(args.reward_ms / one_pass_ms))
    reward_args["passes"] = passes
    print(
        f"reward model: one forward pass over a FrozenLake transcript {one_pass_ms:.0f} ms here; {passes} passes "
        f"per scored trajectory (~{passes * one_pass_ms:.0f} ms)",
        flush=True,
    )
    home = RESULTS / ".reward-service-stack"
    modes = measure(home, n, repeats, reward_args, pinned)
    report(modes, n, repeats, reward_args, pinned)
    return 0


def report(modes: list[dict], n: int, repeats: int, reward_args: dict, pinned: bool) -> None:
    base = modes[0]
    for m in modes:
        m["speedup_vs_baseline"] = base["wall_s"] / m["wall_s"]
        m["rollout_time_ratio"] = m["mean_rollout_s"] / base["mean_rollout_s"]
    print(
        f"\nreward_service: {n} FrozenLake trajectories (standard 4x4, ≤ 8 turns) x {repeats} repeats, medians; "
        f"reward_model {reward_args}; {'generation pinned to its own core' if pinned else 'all processes on all cores'}"
    )
    print(
        f"\n  {'mode':<12}{'wall s':>8}{'mean rollout s':>16}{'traj/s':>8}{'engine busy':>13}{'tokens/s':>10}"
        f"{'generate ms':>13}{'reward work ms':>16}{'reward wait ms':>16}{'speedup':>9}"
    )
    for m in modes:
        print(
            f"  {m['name']:<12}{m['wall_s']:>8.1f}{m['mean_rollout_s']:>16.2f}{m['trajectories_per_s']:>8.2f}"
            f"{m['engine_busy_fraction']:>12.0%}{m['tokens_per_s']:>10.0f}{m['generate_work_ms']:>13.0f}"
            f"{m['reward_work_ms']:>16.0f}{m['reward_wait_ms']:>16.0f}{m['speedup_vs_baseline']:>8.2f}x"
        )
    pairs = [c["wall_s"] / s["wall_s"] for c, s in zip(modes[0]["rounds"], modes[-1]["rounds"])]
    print("  colocated / serverless wall time, round by round: " + ", ".join(f"{p:.2f}" for p in pairs))
    s = modes[-1]
    print(
        f"  serverless / colocated mean rollout time: {s['rollout_time_ratio']:.2f} "
        f"(paper: {PAPER['serverless_rollout_s']:.0f} s / {PAPER['colocated_rollout_s']:.0f} s = "
        f"{PAPER['serverless_rollout_s'] / PAPER['colocated_rollout_s']:.2f}; GPU utilisation "
        f"{PAPER['gpu_util_colocated']:.0%} → {PAPER['gpu_util_serverless']:.0%})"
    )
    for m in modes:
        print(
            f"  {m['name']}: rewards ran on {', '.join(m['reward_queues'])}; CPU cores used: "
            + ", ".join(f"{k} {v:.2f}" for k, v in m["cpu_cores"].items())
        )
        for e in m["autoscaler_events"]:
            if e["kind"] in ("decision", "ready", "exit"):
                print(f"    autoscaler: {e['kind']}: {e['detail']}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {
        "n": n,
        "repeats": repeats,
        "reward_args": reward_args,
        "pinned": pinned,
        "paper": PAPER,
        "modes": [{k: v for k, v in m.items() if k != "rounds"} | {"rounds": m["rounds"]} for m in modes],
    }
    (RESULTS / "reward_service.json").write_text(json.dumps(out, indent=2))
    png = plot_modes(
        "reward_service",
        modes,
        f"reward_service: {n} trajectories, rewards colocated vs serverless",
        extra_key="trajectories_per_s",
        extra_label="trajectories/s",
    )
    print(f"\n  written: {RESULTS / 'reward_service.json'}, {png}")
