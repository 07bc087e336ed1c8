"""Affinity: the multi-task job with per-task pool routing against everything on one generation pool.

Two generation workers either way, same job, same steps (trajectory rollout, async bound 1):

- `one pool` (the baseline): both tasks generate on `h800`, served by two h800 workers that share
  one queue (Temporal hands each request to whichever worker polls first);
- `affinity`: FrozenLake → `h800` (one worker), arithmetic → `h20` (one worker), as the job declares.

The two layouts need different workers, so each runs on its own stack, one after the other (the
baseline first). On this machine both "pools" are the same CPU cores and the same tiny model: what
affinity changes here is only which requests share an engine (FrozenLake's short one-token prompts
vs arithmetic's n = 16 groups), not the hardware under them. On a cluster the h800 and h20 workers
are different GPUs and the comparison also holds the hardware's fit.
"""

from __future__ import annotations

import argparse
import asyncio

from bench.report import RESULTS, format_table, plot_modes, summarize, write_results
from bench.training_run import measure_job, stack_for
from bench.workload import LATENCY, multitask_job
from rollart.infra.temporal.connection import connect
from rollart.spec.pools import Pool

HOME = RESULTS / ".stack-affinity"
LAYOUTS: dict[str, tuple[Pool | None, list[Pool]]] = {
    "one pool (2x h800)": (Pool.H800, [Pool.CONTROL, Pool.CPU, Pool.H800, Pool.H800, Pool.SERVERLESS, Pool.TRAINER]),
    "affinity (h800 + h20)": (None, [Pool.CONTROL, Pool.CPU, Pool.H800, Pool.H20, Pool.SERVERLESS, Pool.TRAINER]),
}
BASELINE = "one pool (2x h800)"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench affinity", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="4 steps x 1 repeat (< 5 min)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args(argv)
    steps, repeats = (4, 1) if args.quick else (args.steps, args.repeats)
    runs: dict[str, list[dict]] = {}
    for name, (single, pools) in LAYOUTS.items():
        home = HOME / ("single" if single else "affinity")
        job = multitask_job(home, steps, batch_size=args.batch_size, single_pool=single)
        print(f"affinity: {name}: starting the stack ({', '.join(map(str, pools))}) ...", flush=True)
        with stack_for(job, home, pools) as stack:
            runs[name] = asyncio.run(_run(stack, home, job, steps, repeats, name, single, args.batch_size))
    rows = summarize(runs, BASELINE)
    report(rows, steps, repeats, args.batch_size)
    return 0


async def _run(stack, home, job, steps, repeats, name, single, batch_size) -> list[dict]:
    client = await connect(stack.temporal, stack.store)
    await measure_job(
        client, multitask_job(home, 2, batch_size=batch_size, single_pool=single), "warmup", home / "runs"
    )
    out = []
    for r in range(repeats):
        m = await measure_job(
            client, job, f"affinity-{'single' if single else 'split'}-r{r}", home / "runs", stack=stack
        )
        out.append(m)
        print(
            f"  repeat {r + 1}/{repeats} {name:<22} {m['wall_s']:6.1f} s  {m['trajectories_per_s']:5.1f} traj/s  "
            f"per generation worker busy: " + ", ".join(f"{v:.0%}" for v in m["busy_per_gen_worker"].values()),
            flush=True,
        )
    return out


COLUMNS = [
    ("name", "layout", ""),
    ("wall_s", "wall s", ".1f"),
    ("speedup_vs_baseline", "vs one pool", ".2f"),
    ("trajectories_per_s", "traj/s", ".1f"),
    ("busy_generation", "gen busy (any)", ".0%"),
    ("gen_worker_busy_min", "worker busy min", ".0%"),
    ("gen_worker_busy_max", "worker busy max", ".0%"),
    ("generate_p50_s", "generate p50 s", ".3f"),
    ("busy_trainer", "trainer busy", ".0%"),
]


def report(rows: list[dict], steps: int, repeats: int, batch_size: int) -> None:
    print(
        f"\naffinity: {steps} training steps of the multi-task job (trajectory rollout, bound 1), batch {batch_size}, "
        f"two generation workers either way, medians of {repeats} repeat(s)"
    )
    print(format_table(rows, COLUMNS))
    print("  worker busy = share of the wall time with at least one generate call running on that worker")
    path = write_results(
        "affinity", rows, steps=steps, repeats=repeats, batch_size=batch_size, latency=LATENCY, baseline=BASELINE
    )
    png = plot_modes(
        "affinity",
        rows,
        f"affinity: {steps} steps, two generation workers either way",
        extra_key="trajectories_per_s",
        extra_label="trajectories/s",
    )
    print(f"\n  written: {path}, {png}")


__all__ = ["LAYOUTS", "main"]
