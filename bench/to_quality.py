"""Time to quality: how long each mode takes to *learn*, not to run N steps (the paper's end-to-end measure).

`python -m bench end_to_end --to-quality [--seeds 3] [--cap 150]` trains the default example
(examples/frozenlake.yaml) in each mode of `MODES` (sync, batch b1, trajectory b1 and b2) for every seed, one
run after the other on one local stack, seeds interleaved across modes so machine noise hits them alike. A run
ends once the target held `--window` steps in a row (by then its `--window`-step mean has reached it) or at
`--cap` steps. Per mode: the share of runs reaching the target, the median steps and minutes to it (over
the runs that did), and sync's median minutes over the mode's (> 1: the mode learns sooner). A step that
does not learn is not progress: a mode that steps 2x faster and learns half as often is not 2x faster.
Writes bench/results/to_quality.json.
"""

from __future__ import annotations

import asyncio
import statistics
from typing import Any

from bench.end_to_end import BASELINE, MODES
from bench.learning import HOME, bench_job, for_run, forget_earlier_runs, measure, train_and_eval
from bench.report import format_table, write_results
from bench.training_run import stack_for
from rollart.spec.config import JobSpec
from rollart.workers.local_stack import pools_for_job

__all__ = ["mode_job", "quality_rows", "run"]


def mode_job(base: JobSpec, rollout_mode: str, bound: int, seed: int) -> JobSpec:
    """The example in one mode with every seed it has set to `seed` (`bench.learning.for_run`)."""
    job = for_run(base, bound, seed)
    return job.model_copy(update={"training": job.training.model_copy(update={"rollout_mode": rollout_mode})})


def quality_rows(runs: dict[str, list[dict[str, Any]]], baseline: str = BASELINE) -> list[dict[str, Any]]:
    """Per mode: runs, share reaching the target, median steps / minutes to it, per-step seconds, and the
    baseline's median minutes over this mode's (`vs_sync`; None where either never reached it)."""
    rows = []
    for name, mine in runs.items():
        hit = [r for r in mine if r["steps_to_target"] is not None]
        per_step = [r["elapsed_s"][-1] / len(r["elapsed_s"]) for r in mine if r["elapsed_s"]]
        rows.append(
            {
                "name": name,
                "runs": len(mine),
                "reached_share": len(hit) / len(mine) if mine else 0.0,
                "steps_to_target": statistics.median(r["steps_to_target"] for r in hit) if hit else None,
                "minutes_to_target": statistics.median(r["minutes_to_target"] for r in hit) if hit else None,
                "s_per_step": statistics.median(per_step) if per_step else None,
                "each": [r["steps_to_target"] for r in mine],
            }
        )
    base = next((r["minutes_to_target"] for r in rows if r["name"] == baseline), None)
    for row in rows:
        row["vs_sync"] = base / row["minutes_to_target"] if base and row["minutes_to_target"] else None
    return rows


COLUMNS = [
    ("name", "mode", ""),
    ("runs", "runs", ".0f"),
    ("reached_share", "reach 0.8", ".0%"),
    ("steps_to_target", "steps to 0.8", ".0f"),
    ("minutes_to_target", "min to 0.8", ".2f"),
    ("vs_sync", "vs sync (time to 0.8)", ".2f"),
    ("s_per_step", "s/step", ".2f"),
]


def run(seeds: int, cap: int, target: float = 0.8, window: int = 5) -> int:
    stop = f"training.stop_when={{success: {target}, steps: {window}}}"
    base = bench_job("frozenlake", [stop], cap)
    print(f"to quality: examples/frozenlake.yaml, {len(MODES)} modes x {seeds} seeds, target {target}, cap {cap}")
    forget_earlier_runs()
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    with stack_for(base, HOME, pools_for_job(base, training=True)) as stack:
        for seed in range(seeds):
            for name, (mode, bound) in MODES.items():
                r = asyncio.run(train_and_eval(stack, mode_job(base, mode, bound, seed), 20))
                r.update(seed=seed, **measure(r, target, window))
                runs[name].append(r)
                to = r["steps_to_target"]
                print(f"  seed {seed} {name:<16} to {target}: {to or 'not reached'} steps", flush=True)
    rows = quality_rows(runs)
    print(f"\nto quality: time to {target} success ({window}-step mean), medians over the runs that reached it")
    print(format_table(rows, COLUMNS))
    path = write_results("to_quality", rows, seeds=seeds, cap=cap, target=target, window=window, runs=runs)
    print(f"\n  written: {path}")
    return 0
