"""Engines: two vLLM engines on one pool with and without session affinity (one engine as the reference), and
admission by engine pressure against the fixed cap on a small KV cache.

Affinity. A multi-turn task whose prompt grows every turn (tool use: the question, then every call and its
output so far), so that each turn's prompt starts with the previous one and the engine that served the
previous turn has it in its prefix cache. N trajectories are rolled out (`rollart rollout`'s path, no
training: a weight swap would empty the caches) in three modes: `1 engine` (the reference), `2 engines,
affinity` (`engine.affinity: session`, the default) and `2 engines, no affinity` (`none`: every turn to the
pool's queue, any engine). The prefix-cache hit rate is the engines' own count (prompt tokens found in the
cache / looked up; vLLM's CPU blocks are 128 tokens, so only whole blocks hit), read from the last report
of each engine in the trajectories' results, before and after the run; tokens/s counts prompt and completion
tokens. Target (the issue's): with affinity the hit rate is at least 0.8x the single engine's; without, it
falls toward half.

Admission. One engine with a KV cache far too small for what the async bound lets in flight (`--kv-gib`): a
training job (trajectory mode, bound 1) with the fixed cap, (bound + 1) x batch in flight, against
`training.admission.adaptive`, whose cap falls when the engine reports KV pressure or preemptions.
Reported: wall, trajectories/s, tokens/s, the engine's preemptions over the run, and the cap at the end.

The two-engine modes share one stack (affinity is the job's, not the workers'), alternating per repeat; each
layout is its own stack, one after the other, on this machine's two cores.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import Client

from bench.report import RESULTS, format_table, summarize, write_results
from bench.training_run import stack_for
from rollart.client.rollout import RolloutOutcome, plan_trajectories, run_rollout
from rollart.client.train import start_training
from rollart.contracts.generation import EnginePressure
from rollart.contracts.training import TrainingResult, TrainingStatus
from rollart.infra.temporal.connection import connect
from rollart.spec.config import EngineConfig, JobSpec, StoreConfig, TaskSpec, TrainingConfig
from rollart.spec.pools import Pool
from rollart.workers.local_stack import LocalStack

__all__ = ["main", "tool_use_task"]

HOME = RESULTS / ".stack-engines"
ONE = [Pool.CONTROL, Pool.CPU, Pool.H800, Pool.SERVERLESS]
TWO = [Pool.CONTROL, Pool.CPU, Pool.H800, Pool.H800, Pool.SERVERLESS]
AFFINITY_MODES = {
    "1 engine": ("session", ONE),
    "2 engines, affinity": ("session", TWO),
    "2 engines, no affinity": ("none", TWO),
}
"""Mode → (engine.affinity, the stack's pools)."""
BASELINE = "1 engine"


def tool_use_task(max_turns: int = 8) -> TaskSpec:
    """Tool use with room for a long history: each turn's prompt is the last one plus the call and its output."""
    return TaskSpec(
        name="tool_use",
        env="tool_use",
        env_args={"tools": ["calc"], "max_observation_chars": 1400, "invalid_action": "noop", "digits": 4},
        reward="success",
        generate_pool=Pool.H800,
        max_turns=max_turns,
        sampling={"temperature": 1.0, "top_k": 0, "max_tokens": 24, "stop": ["</calc>", "</answer>"]},
    )


def job(home: Path, affinity: str, **engine: Any) -> JobSpec:
    return JobSpec(
        name="engines",
        model_dir=home.parent / "model",
        tasks=[tool_use_task()],
        engine=EngineConfig(max_model_len=1024, **{"affinity": affinity, **engine}),
        store=StoreConfig(path=home / "store"),
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench engines", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="32 trajectories x 1 repeat, 3 steps (~6 min)")
    parser.add_argument("--trajectories", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6, help="training steps of each admission run")
    parser.add_argument("--kv-gib", type=float, default=0.02, help="the admission runs' KV cache (GiB)")
    parser.add_argument("--only", choices=["affinity", "admission"], help="run one part")
    args = parser.parse_args(argv)
    n, repeats, steps = (32, 1, 3) if args.quick else (args.trajectories, args.repeats, args.steps)
    out: dict[str, Any] = {}
    if args.only != "admission":
        out["affinity"] = affinity_part(n, repeats)
    if args.only != "affinity":
        out["admission"] = admission_part(steps, repeats, args.kv_gib)
    report(out, n, repeats, steps, args.kv_gib)
    return 0


# ---------------------------------------------------------------- affinity


def affinity_part(n: int, repeats: int) -> list[dict[str, Any]]:
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in AFFINITY_MODES}
    for layout in (ONE, TWO):
        names = [name for name, (_, pools) in AFFINITY_MODES.items() if pools is layout]
        home = HOME / f"{layout.count(Pool.H800)}-engines"
        print(f"engines: starting a stack with {layout.count(Pool.H800)} h800 worker(s) ...", flush=True)
        with stack_for(job(home, "session"), home, layout) as stack:
            asyncio.run(_affinity_runs(stack, home, names, n, repeats, runs))
    return summarize(runs, BASELINE)


async def _affinity_runs(
    stack: LocalStack, home: Path, names: list[str], n: int, repeats: int, runs: dict[str, list[dict[str, Any]]]
) -> None:
    client = await connect(stack.temporal, stack.store)
    last = _snapshots(await _rollout(client, job(home, "session"), 16, seed=999))  # warm-up; engines' counts so far
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            spec = job(home, AFFINITY_MODES[name][0])
            t0 = time.monotonic()
            outcomes = await _rollout(client, spec, n, seed=1000 * (r + 1) + len(runs[name]))
            wall = time.monotonic() - t0
            now = _snapshots(outcomes)
            m = _affinity_measure(outcomes, wall, last, now)
            last = {**last, **now}
            runs[name].append(m)
            print(
                f"  {name:<24} repeat {r + 1}/{repeats}: {wall:6.1f} s  prefix hits {m['prefix_hit_rate']:.0%}  "
                f"{m['tokens_per_s']:,.0f} tok/s  moves/traj {m['moves_per_trajectory']:.2f}  failed {m['failed']}",
                flush=True,
            )


async def _rollout(client: Client, spec: JobSpec, n: int, seed: int) -> list[RolloutOutcome]:
    job_id = f"engines-{uuid.uuid4().hex[:6]}"
    return await run_rollout(client, plan_trajectories(spec, n, seed=seed, job_id=job_id), job_id)


def _snapshots(outcomes: list[RolloutOutcome]) -> dict[str, EnginePressure]:
    """Each engine's latest report among the results (its counts only grow: the largest is the latest)."""
    latest: dict[str, EnginePressure] = {}
    for o in outcomes:
        r = o.result
        if r is None or r.pressure is None or not r.engine_worker:
            continue
        if r.engine_worker not in latest or r.pressure.prefix_queries > latest[r.engine_worker].prefix_queries:
            latest[r.engine_worker] = r.pressure
    return latest


def _affinity_measure(
    outcomes: list[RolloutOutcome], wall: float, before: dict[str, EnginePressure], after: dict[str, EnginePressure]
) -> dict[str, Any]:
    done = [o.result for o in outcomes if o.result is not None and o.result.status == "completed"]
    queries = sum(p.prefix_queries - before.get(w, EnginePressure()).prefix_queries for w, p in after.items())
    hits = sum(p.prefix_hits - before.get(w, EnginePressure()).prefix_hits for w, p in after.items())
    prompt = sum(r.prompt_tokens for r in done)
    completion = sum(r.completion_tokens for r in done)
    turns = sum(r.turns for r in done)
    return {
        "wall_s": wall,
        "trajectories_per_s": len(done) / wall,
        "tokens_per_s": (prompt + completion) / wall,
        "completion_tokens_per_s": completion / wall,
        "prefix_hit_rate": hits / queries if queries else 0.0,
        "prompt_tokens_per_turn": prompt / turns if turns else 0.0,
        "moves_per_trajectory": sum(r.engine_moves for r in done) / max(1, len(done)),
        "engines": len(after),
        "failed": len(outcomes) - len(done),
    }


# ---------------------------------------------------------------- admission


def admission_part(steps: int, repeats: int, kv_gib: float) -> list[dict[str, Any]]:
    home = HOME / "admission"
    base = job(home, "session", kv_cache_gib=kv_gib).model_copy(
        update={"training": TrainingConfig(steps=steps, batch_size=32, async_bound=1)}
    )
    modes = {"fixed cap": False, "adaptive": True}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in modes}
    print(f"engines: starting a stack with one h800 worker, KV cache {kv_gib:g} GiB ...", flush=True)
    with stack_for(base, home, [*ONE, Pool.TRAINER]) as stack:
        asyncio.run(_admission_runs(stack, home, base, modes, repeats, runs))
    return summarize(runs, "fixed cap")


async def _admission_runs(
    stack: LocalStack,
    home: Path,
    base: JobSpec,
    modes: dict[str, bool],
    repeats: int,
    runs: dict[str, list[dict[str, Any]]],
) -> None:
    client = await connect(stack.temporal, stack.store)
    await _rollout(client, base, 8, seed=999)  # warm-up
    for r in range(repeats):
        for name in list(modes) if r % 2 == 0 else list(modes)[::-1]:
            admission = base.training.admission.model_copy(update={"adaptive": modes[name]})
            spec = base.model_copy(update={"training": base.training.model_copy(update={"admission": admission})})
            job_id = f"engines-adm-{uuid.uuid4().hex[:6]}"
            t0 = time.monotonic()
            handle = await start_training(client, spec, job_id, home / "runs" / job_id)
            result: TrainingResult = await handle.result()
            wall = time.monotonic() - t0
            status = await handle.query("status", result_type=TrainingStatus)
            m = _admission_measure(result, status, wall)
            runs[name].append(m)
            print(
                f"  {name:<10} repeat {r + 1}/{repeats}: {wall:6.1f} s  {m['trajectories_per_s']:.1f} traj/s  "
                f"preempted {m['preempted']}  cap {m['cap_end']} (cut {m['cuts']}x)  failed {result.failed}",
                flush=True,
            )


def _admission_measure(result: TrainingResult, status: TrainingStatus, wall: float) -> dict[str, Any]:
    first = status.history[0] if status.history else None
    preempted = sum(p.preempted for p in status.engines.values()) - (first.preempted or 0 if first else 0)
    caps = [h.admission_cap for h in status.history if h.admission_cap is not None]
    finished = result.trained + result.dropped + result.failed + result.buffered_unused
    return {
        "wall_s": wall,
        "trajectories_per_s": finished / wall,
        "completion_tokens_per_s": sum(h.completion_tokens for h in status.history) / wall,
        "preempted": max(0, preempted),
        "kv_usage_max": max((h.kv_usage or 0.0 for h in status.history), default=0.0),
        "cap_end": status.admission_cap if status.admission_cap is not None else status.in_flight_limit,
        "cap_min": min(caps, default=status.in_flight_limit),
        "cuts": status.admission_cuts,
        "failed": result.failed,
    }


# ---------------------------------------------------------------- report

AFFINITY_COLUMNS = [
    ("name", "mode", ""),
    ("wall_s", "wall s", ".1f"),
    ("speedup_vs_baseline", "vs 1 engine", ".2f"),
    ("prefix_hit_rate", "prefix hits", ".0%"),
    ("tokens_per_s", "tok/s", ",.0f"),
    ("trajectories_per_s", "traj/s", ".2f"),
    ("moves_per_trajectory", "moves/traj", ".2f"),
    ("failed", "failed", ".0f"),
]
ADMISSION_COLUMNS = [
    ("name", "admission", ""),
    ("wall_s", "wall s", ".1f"),
    ("speedup_vs_baseline", "vs fixed", ".2f"),
    ("trajectories_per_s", "traj/s", ".2f"),
    ("completion_tokens_per_s", "completion tok/s", ".0f"),
    ("preempted", "preempted", ".0f"),
    ("kv_usage_max", "KV max", ".0%"),
    ("cap_min", "cap min", ".0f"),
    ("cap_end", "cap end", ".0f"),
    ("cuts", "cuts", ".0f"),
]


def report(out: dict[str, Any], n: int, repeats: int, steps: int, kv_gib: float) -> None:
    if "affinity" in out:
        print(f"\nengines: affinity, {n} tool-use trajectories of 8 turns per run, medians of {repeats} repeat(s)")
        print(format_table(out["affinity"], AFFINITY_COLUMNS))
        hits = {r["name"]: r["prefix_hit_rate"] for r in out["affinity"]}
        if hits.get(BASELINE):
            print(
                f"  hit rate vs 1 engine: affinity {hits['2 engines, affinity'] / hits[BASELINE]:.2f}x, "
                f"no affinity {hits['2 engines, no affinity'] / hits[BASELINE]:.2f}x (target: >= 0.8x and -> 0.5x)"
            )
    if "admission" in out:
        print(f"\nengines: admission, {steps} steps, batch 32, bound 1, KV {kv_gib:g} GiB, medians of {repeats}")
        print(format_table(out["admission"], ADMISSION_COLUMNS))
    for part, rows in out.items():
        path = write_results(f"engines-{part}", rows, trajectories=n, repeats=repeats, steps=steps, kv_gib=kv_gib)
        print(f"  written: {path}")
