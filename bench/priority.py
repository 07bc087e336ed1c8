"""Priority: a long-tail workload on one real vLLM engine, FIFO against trajectory-aware priority, in one run.

`engine.priority: turns` ranks each generation request by the turns its trajectory has done (vLLM's priority
scheduler serves lower ranks first), so the long episodes that decide when a step is complete are not queued
behind episodes just starting; `predicted` ranks it by its predicted length, here its task's length (what the
training workflow's moving mean of the task's turns reaches: every episode plays all its turns), so a long
episode goes first from its first turn. Here N FrozenLake trajectories are played `--in-flight` at a time, a
finished one making room for the next as the training workflow keeps its rollouts going: 7 in 8 play 2 turns,
1 in 8 plays `--long-turns` (standard map, invalid moves no-ops, so every episode plays all its turns). The
engine admits `--max-num-seqs` requests at a time, so requests wait in its scheduler as they do on a loaded GPU engine.

Both modes run the rollout driver in this process over the same activity code (`rollart eval`'s path: env,
generate and reward activities, a vLLM AsyncLLM engine, no Temporal), on an engine started for each round,
the modes alternating within each repeat. Reports the makespan (all trajectories done), the p50 and p99 trajectory
time, and the long and short episodes' median times; medians of the repeats, ratios to FIFO.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from typing import Any

from bench.report import RESULTS, format_table, summarize, write_results
from bench.workload import NO_LATENCY, frozenlake_task
from rollart.client.in_process import InProcessCalls, in_process_activities, play_unit, started_engine
from rollart.client.rollout import plan_trajectories, rollout_units
from rollart.contracts.rollouts import TrajectoryResult
from rollart.infra.tiny_model import build_tiny_model
from rollart.spec.config import EngineConfig, JobSpec, PriorityPolicy, StoreConfig

HOME = RESULTS / ".priority"
ENV_ARGS = {"maps": "standard", "invalid_action": "noop"}  # untrained moves are no-ops: episodes play every turn
POLICIES: tuple[PriorityPolicy, ...] = ("fifo", "turns", "predicted")
SHORT_TURNS = 2


def workload_job(policy: PriorityPolicy, long_turns: int, max_num_seqs: int, max_tokens: int) -> JobSpec:
    """Short (2 turns, weight 7) and long (`long_turns`, weight 1) FrozenLake episodes, each drawn on its own
    (groups of 1), on one engine."""

    def task(name: str, turns: int, weight: float):
        base = frozenlake_task(NO_LATENCY, max_turns=turns, env_args=ENV_ARGS)
        sampling = base.sampling.model_copy(update={"max_tokens": max_tokens})
        return base.model_copy(update={"name": name, "weight": weight, "sampling": sampling, "group_size": 1})

    return JobSpec(
        name="priority",
        model_dir=HOME / "model",
        tasks=[task("short", SHORT_TURNS, 7.0), task("long", long_turns, 1.0)],
        engine=EngineConfig(max_model_len=512, max_num_seqs=max_num_seqs, priority=policy),
        store=StoreConfig(path=HOME / "store"),
    )


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by the nearest rank: p99 of 64 values is the largest but none."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


async def one_round(
    calls: InProcessCalls, engine: Any, job: JobSpec, n: int, in_flight: int, seed: int
) -> dict[str, float]:
    """N trajectories, `in_flight` at a time (a finished one makes room for the next, as the training workflow
    keeps its rollouts going), each played by the driver as its own coroutine. A trajectory's time runs from
    its own start; the makespan from the first start to the last result."""
    job_id = f"prio-{seed}-{uuid.uuid4().hex[:6]}"
    inputs = plan_trajectories(job, n, seed=seed, job_id=job_id)
    if job.engine.priority == "predicted":  # what the training workflow's moving mean of each task's turns reaches
        inputs = [i.model_copy(update={"predicted_turns": float(i.task.max_turns)}) for i in inputs]  # all played
    units = rollout_units(inputs)
    slots = asyncio.Semaphore(in_flight)
    preempted = engine.pressure().preempted
    t0 = time.monotonic()

    async def timed(first: int, members: list) -> tuple[float, list[TrajectoryResult]]:
        async with slots:
            start = time.monotonic()
            results = await play_unit(calls, first, members, job_id)
            return time.monotonic() - start, results

    done = await asyncio.gather(*(timed(first, members) for first, members in units))
    wall = time.monotonic() - t0
    times = [w for w, _ in done]
    long = [w for w, rs in done for r in rs if r.turns > SHORT_TURNS]
    short = [w for w, rs in done for r in rs if r.turns <= SHORT_TURNS]
    return {
        "wall_s": wall,
        "p50_s": percentile(times, 0.5),
        "p99_s": percentile(times, 0.99),
        "long_s": statistics.median(long) if long else float("nan"),
        "short_s": statistics.median(short) if short else float("nan"),
        "long_episodes": len(long),
        "completed": sum(r.status == "completed" for _, rs in done for r in rs),
        "preempted": engine.pressure().preempted - preempted,  # requests the scheduler evicted to run others
    }


async def measure(
    n: int, in_flight: int, repeats: int, long_turns: int, max_num_seqs: int, max_tokens: int
) -> dict[str, list]:
    """Each repeat runs FIFO then priority on the same seeds, each on an engine of its own started for the round
    (two vLLM engines held at once in one process slowed each other here)."""
    runs: dict[str, list[dict]] = {p: [] for p in POLICIES}
    for r in range(repeats):
        for p in POLICIES:
            job = workload_job(p, long_turns, max_num_seqs, max_tokens)
            async with started_engine(job.model_dir, job.engine) as engine:
                async with in_process_activities(engine, job.model_dir, job.store) as calls:
                    await one_round(calls, engine, job, 16, 16, seed=999)  # warm-up
                    m = await one_round(calls, engine, job, n, in_flight, seed=r)
            runs[p].append(m)
            print(
                f"  repeat {r + 1}/{repeats} {p:<6} makespan {m['wall_s']:6.2f} s  p99 {m['p99_s']:6.2f} s  "
                f"long {m['long_s']:6.2f} s  short {m['short_s']:6.2f} s  preempted {m['preempted']}",
                flush=True,
            )
    return runs


COLUMNS = [
    ("name", "engine.priority", ""),
    ("wall_s", "makespan s", ".2f"),
    ("speedup_vs_baseline", "vs fifo", ".2f"),
    ("p50_s", "p50 s", ".2f"),
    ("p99_s", "p99 s", ".2f"),
    ("long_s", "long episodes s", ".2f"),
    ("short_s", "short episodes s", ".2f"),
    ("preempted", "preempted", ".0f"),
    ("completed", "completed", ".0f"),
]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench priority", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="64 trajectories x 2 repeats (< 3 min)")
    parser.add_argument("-n", type=int, default=192, help="trajectories per repeat (default 192)")
    parser.add_argument("--in-flight", type=int, default=32, help="trajectories in flight at once (default 32)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--long-turns", type=int, default=16, help="turns of a long episode (default 16)")
    parser.add_argument("--max-num-seqs", type=int, default=8, help="requests the engine runs at once (default 8)")
    parser.add_argument("--max-tokens", type=int, default=8, help="tokens per reply (default 8)")
    args = parser.parse_args(argv)
    n, repeats = (64, 2) if args.quick else (args.n, args.repeats)
    build_tiny_model(HOME / "model", seed=0)
    print(
        f"priority: {n} FrozenLake trajectories, {args.in_flight} in flight (1 in 8 of {args.long_turns} turns, the "
        f"rest {SHORT_TURNS}) x {repeats} repeats, one vLLM engine per policy running {args.max_num_seqs} at once",
        flush=True,
    )
    runs = asyncio.run(measure(n, args.in_flight, repeats, args.long_turns, args.max_num_seqs, args.max_tokens))
    rows = summarize(runs, "fifo")
    print(f"\npriority: medians of {repeats} repeats")
    print(format_table(rows, COLUMNS))
    print("  vs fifo = FIFO's makespan / this policy's (> 1: sooner); long / short = median time of those episodes")
    path = write_results(
        "priority",
        rows,
        n=n,
        repeats=repeats,
        long_turns=args.long_turns,
        max_num_seqs=args.max_num_seqs,
        max_tokens=args.max_tokens,
        in_flight=args.in_flight,
    )
    print(f"\n  written: {path}")
    return 0


__all__ = ["main", "workload_job"]
