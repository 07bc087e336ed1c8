"""Peer: TRL's GRPOTrainer against `rollart train` on the same task, model, batch and group size.

The task is examples/arithmetic.yaml (single-digit a+b, one-token answers, groups of 16, batch 256, the
entropy bonus and lr of that file) on the tiny Qwen2 built locally (the same init for both). The modes
run one after the other on this machine:

- `trl` (the baseline): `GRPOTrainer` in one process (bench/trl_grpo.py): transformers generation, the
  task's env and reward as its dataset and reward function, the job's sampling, optimizer and loss settings;
- `rollart`: `rollart train` of the same job on the full local stack (dev server, a worker process per
  pool, vLLM generation, the torch trainer), async bound 1 as in the example; the stack's start-up
  (engine load) is not timed.

Each run stops when the mean training success of the last `--window` steps reaches `--target` (0.8), or at
the step / time cap. Reported per mode: the median seconds per step (steps after the first `WARMUP`),
minutes and steps to the target, the last window's success; `speedup_vs_baseline` = TRL's median seconds per
step over rollart's (0.25: rollart is 4x slower per step). `wall_s` in the results is that median.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from bench.report import RESULTS, format_table, summarize, write_results
from bench.training_run import REPO, stack_for
from bench.trl_grpo import TRL_PIN, ensure_trl, run_trl
from rollart.client.train import MetricsWriter, follow, start_training, terminate_job
from rollart.infra.temporal.connection import connect
from rollart.infra.tiny_model import ensure_tiny_model
from rollart.spec.config import JobSpec, load_job
from rollart.workers.local_stack import pools_for_job

__all__ = ["main"]

HOME = RESULTS / ".stack-peer_trl"
EXAMPLE = REPO / "examples" / "arithmetic.yaml"
BASELINE = "trl"
WARMUP = 3
"""Steps left out of the seconds-per-step median: the first ones compile kernels and warm caches."""


def bench_job(max_steps: int) -> JobSpec:
    """examples/arithmetic.yaml with the model and store under the bench's home and `max_steps` steps."""
    return load_job(
        EXAMPLE,
        {
            "model_dir": str(HOME / "model"),
            "store": {"kind": "local", "path": str(HOME / "store")},
            "training": {"steps": max_steps},
        },
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench peer_trl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="each mode capped at 1 minute / 100 steps (~4 min)")
    parser.add_argument("--max-steps", type=int, default=2000, help="step cap per mode (default 2000)")
    parser.add_argument("--max-minutes", type=float, default=30.0, help="training-time cap per mode (default 30)")
    parser.add_argument("--target", type=float, default=0.8, help="training success to reach (default 0.8)")
    parser.add_argument("--window", type=int, default=20, help="steps the success is averaged over (default 20)")
    parser.add_argument(
        "--trl-threads", type=int, default=1, help="torch threads for TRL (default 1, as rollart's trainer worker)"
    )
    parser.add_argument("--modes", default="trl,rollart", help="comma-separated subset of trl,rollart")
    args = parser.parse_args(argv)
    max_steps, max_s = (100, 60.0) if args.quick else (args.max_steps, 60 * args.max_minutes)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    job = bench_job(max_steps)
    ensure_tiny_model(job.model_dir)
    curves: dict[str, dict[str, Any]] = {}
    if "trl" in modes:
        ensure_trl()
        import torch

        torch.set_num_threads(args.trl_threads)
        print(
            f"peer_trl: trl ({TRL_PIN}, {args.trl_threads} torch thread(s)): ≤ {max_steps} steps / {max_s:.0f} s ...",
            flush=True,
        )
        run = run_trl(job, max_steps, max_s, args.target, args.window)
        curves["trl"] = {
            "elapsed_s": run.step_end_s,
            "success": run.success[: len(run.step_end_s)],
            "stopped": run.stopped_because,
        }
    if "rollart" in modes:
        print(f"peer_trl: rollart: starting the local stack, then ≤ {max_steps} steps / {max_s:.0f} s ...", flush=True)
        with stack_for(job, HOME, pools_for_job(job, training=True)) as stack:
            curves["rollart"] = asyncio.run(_rollart(stack, job, max_s, args.target, args.window))
    runs = {name: [measure(c, args.target, args.window)] for name, c in curves.items()}
    rows = summarize(runs, BASELINE if BASELINE in runs else next(iter(runs)))
    report(rows, curves, job, args)
    return 0


async def _rollart(stack: Any, job: JobSpec, max_s: float, target: float, window: int) -> dict[str, Any]:
    """Train the job on the stack until the target success is held over `window` steps, the last step, or
    `max_s`; a job stopped early is terminated. Elapsed times are from the client's start call."""
    client = await connect(stack.temporal, stack.store)
    job_id = f"peer-trl-{uuid.uuid4().hex[:6]}"
    run_dir = HOME / "runs" / job_id
    rows: list[dict] = []
    done = asyncio.Event()
    stopped = "max steps"

    def on_step(row: dict) -> None:
        nonlocal stopped
        rows.append(row)
        recent = [r["success_rate"] for r in rows[-window:]]
        if (row["step"] + 1) % 100 == 0:
            print(
                f"  rollart: step {row['step']}, {row['time'] - t0:.0f} s, success (last {len(recent)}) "
                f"{sum(recent) / len(recent):.2f}",
                flush=True,
            )
        if len(recent) == window and sum(recent) / window >= target:
            stopped = "target reached"
            done.set()

    t0 = time.time()
    handle = await start_training(client, job, job_id, run_dir)
    following = asyncio.create_task(follow(handle, MetricsWriter(run_dir), on_step, poll_s=0.5))
    stop = asyncio.create_task(done.wait())
    finished, _ = await asyncio.wait({following, stop}, timeout=max_s, return_when=asyncio.FIRST_COMPLETED)
    if following not in finished:
        stopped = stopped if stop in finished else "time cap"
        await terminate_job(client, job_id, f"peer_trl bench: {stopped}")
    stop.cancel()
    try:
        await following
    except Exception:  # the terminated workflow's result raises: expected here
        pass
    rows.sort(key=lambda r: r["step"])
    return {
        "elapsed_s": [r["time"] - t0 for r in rows],
        "success": [r["success_rate"] for r in rows],
        "stopped": stopped,
        "job_id": job_id,
    }


def measure(curve: dict[str, Any], target: float, window: int) -> dict[str, Any]:
    """One mode's numbers from its per-step curve: median s/step after WARMUP, time and steps to the target."""
    t, s = curve["elapsed_s"], curve["success"]
    gaps = [b - a for a, b in itertools.pairwise(t)][WARMUP:] or [float("nan")]
    reached = next((i for i in range(window - 1, len(s)) if sum(s[i - window + 1 : i + 1]) / window >= target), None)
    last = s[-window:] or [0.0]
    return {
        "wall_s": statistics.median(gaps),
        "s_per_step": statistics.median(gaps),
        "steps": len(t),
        "run_s": t[-1] if t else 0.0,
        "steps_to_target": reached + 1 if reached is not None else None,
        "minutes_to_target": t[reached] / 60 if reached is not None else None,
        "final_success": sum(last) / len(last),
        "stopped": curve["stopped"],
    }


COLUMNS = [
    ("name", "mode", ""),
    ("s_per_step", "s/step (median)", ".3f"),
    ("speedup_vs_baseline", "vs trl", ".2f"),
    ("steps", "steps", ".0f"),
    ("run_s", "run s", ".0f"),
    ("steps_to_target", "steps to target", ".0f"),
    ("minutes_to_target", "min to target", ".1f"),
    ("final_success", "last success", ".2f"),
    ("stopped", "stopped", ""),
]


def report(rows: list[dict], curves: dict[str, dict[str, Any]], job: JobSpec, args: argparse.Namespace) -> None:
    """Print the table; write bench/results/peer_trl.json (rows + each mode's curve) and the success-curve plot."""
    for row in rows:  # summarize keeps numeric fields only: put back what the run said
        m = measure(curves[row["name"]], args.target, args.window)
        row.update({k: m[k] for k in ("stopped", "steps_to_target", "minutes_to_target")})
    (task,) = job.tasks
    print(
        f"\npeer_trl: examples/arithmetic.yaml, batch {job.training.batch_size} (groups of {task.group_size}), "
        f"target: mean training success of {args.window} steps ≥ {args.target}"
    )
    print(format_table(rows, COLUMNS))
    print("  vs trl = TRL's median s/step / this mode's (< 1: slower per step than TRL); '-' = target not reached")
    path = write_results(
        "peer_trl",
        rows,
        baseline=BASELINE,
        target=args.target,
        window=args.window,
        batch_size=job.training.batch_size,
        group_size=task.group_size,
        trl=TRL_PIN,
        trl_threads=args.trl_threads,
        curves=curves,
    )
    png = plot_curves(curves, args.target, args.window)
    print(f"\n  written: {path}, {png}")


def plot_curves(curves: dict[str, dict[str, Any]], target: float, window: int, directory: Path = RESULTS) -> Path:
    """`peer_trl.png`: each mode's training success (raw, and its `window`-step mean) over wall minutes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for (name, c), color in zip(curves.items(), ("#DD8452", "#4C72B0")):
        minutes, s = [x / 60 for x in c["elapsed_s"]], c["success"]
        mean = [sum(s[max(0, i - window + 1) : i + 1]) / len(s[max(0, i - window + 1) : i + 1]) for i in range(len(s))]
        ax.plot(minutes, s, color=color, alpha=0.25, linewidth=0.8)
        ax.plot(minutes, mean, color=color, label=f"{name} ({window}-step mean)")
    ax.axhline(target, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xlabel("wall minutes since training started")
    ax.set_ylabel("training success")
    ax.set_ylim(0, 1)
    ax.legend()
    ax.set_title("peer_trl: single-digit addition, tiny Qwen2, batch 256 (16 x 16)", fontsize=10)
    fig.tight_layout()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "peer_trl.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
