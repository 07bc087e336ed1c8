"""End to end: time to N training steps of the multi-task job, synchronous baselines against RollArt's modes.

Four modes of the same job (FrozenLake on h800 + arithmetic on h20, the env
latency model of bench/workload.py) on one local stack, repeats interleaved
(mode 1, 2, 3, 4, then again) so machine noise hits every mode alike:

- `batch b0`: lockstep rollout, async bound 0 — synchronous, veRL-style (the baseline);
- `batch b1`: lockstep rollout, bound 1 — one-step off-policy (the next batch rolls out while one trains);
- `traj b1`, `traj b2`: trajectory-level asynchrony, bounds 1 and 2 — RollArt.

FrozenLake runs with the same `rollout_unit` in every mode, so lockstep vs async
is the only difference: `group` by default (a group's 8 members in one env
session; batch mode: every group's phase before any group's next; trajectory
mode: each group on its own), or `--unit trajectory` (an activity per episode
and phase; batch mode: BatchRolloutWorkflow). Arithmetic (single-turn) runs as
whole groups in every mode. `--sokoban` adds GEM's Sokoban (h800, 10 turns, its own slower latency
profile, `SOKOBAN_LATENCY`) as a third task, and writes end_to_end-sokoban.json. `--units` compares rollout
units at bound 1 against the sync baseline (UNIT_MODES: lockstep groups, free members, episodes) and writes
end_to_end[-sokoban]-units.json.
"""

from __future__ import annotations

import argparse
import asyncio

from bench.report import RESULTS, format_table, plot_modes, summarize, write_results
from bench.training_run import POOLS_REPORTED, measure_job, stack_for
from bench.workload import LATENCY, SOKOBAN_LATENCY, multitask_job
from rollart.infra.temporal.connection import connect
from rollart.workers.local_stack import pools_for_job

MODES: dict[str, tuple[str, int]] = {
    "batch b0 (sync)": ("batch", 0),
    "batch b1": ("batch", 1),
    "traj b1": ("trajectory", 1),
    "traj b2": ("trajectory", 2),
}
BASELINE = "batch b0 (sync)"

UNIT_MODES: dict[str, dict[str, object]] = {
    BASELINE: {"rollout_mode": "batch", "async_bound": 0, "rollout_unit": "group"},
    "lockstep groups b1": {"async_bound": 1, "rollout_unit": "group", "group_play": "lockstep"},
    "free members b1": {"async_bound": 1, "rollout_unit": "group", "group_play": "free"},
    "episodes b1": {"async_bound": 1, "rollout_unit": "trajectory"},
}
"""`--units`: the multi-turn tasks' rollout unit under trajectory-level asynchrony, against the sync baseline:
lockstep groups, groups whose members play free of lockstep, and an episode per workflow."""

DECLARED = "declared (fl h800, ar h20)"
PLACEMENT_MODES: dict[str, dict[str, object]] = {
    DECLARED: {},
    "swapped (fl h20, ar h800)": {"placement": {"frozenlake": "h20", "arithmetic": "h800", "sokoban": "h20"}},
    "one pool (h800)": {"placement": {"frozenlake": "h800", "arithmetic": "h800", "sokoban": "h800"}},
    "auto": {"placement": {"frozenlake": "auto", "arithmetic": "auto", "sokoban": "auto"}},
}
"""`--placement`: hand-written placements against `generate_pool: auto` (re-planned every 2 steps), traj b1."""
HOME = RESULTS / ".stack-end_to_end"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench end_to_end", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="6 steps x 2 repeats (~2 min here)")
    parser.add_argument("--steps", type=int, default=20, help="training steps per run (default 20)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats per mode (default 3)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--unit",
        choices=["group", "trajectory"],
        default="group",
        help="FrozenLake's rollout_unit in every mode (default group)",
    )
    parser.add_argument("--sokoban", action="store_true", help="add GEM's Sokoban to the mix (h800, slower env)")
    parser.add_argument(
        "--units",
        action="store_true",
        help="compare rollout units at bound 1 instead of modes: lockstep groups, free members, episodes (UNIT_MODES)",
    )
    parser.add_argument(
        "--placement",
        action="store_true",
        help="compare hand-written placements with generate_pool: auto at traj b1 (PLACEMENT_MODES)",
    )
    parser.add_argument(
        "--to-quality",
        action="store_true",
        help="time to 0.8 success of the default example in each mode, over --seeds (bench/to_quality.py)",
    )
    parser.add_argument("--seeds", type=int, default=3, help="--to-quality: seeds per mode (default 3)")
    parser.add_argument("--cap", type=int, default=150, help="--to-quality: steps per run at most (default 150)")
    args = parser.parse_args(argv)
    if args.to_quality:
        from bench.to_quality import run

        return run(args.seeds, args.cap)
    steps, repeats = (6, 2) if args.quick else (args.steps, args.repeats)
    modes = UNIT_MODES if args.units else {n: {"rollout_mode": m, "async_bound": b} for n, (m, b) in MODES.items()}
    modes = PLACEMENT_MODES if args.placement else modes
    common = {"batch_size": args.batch_size, "sokoban": args.sokoban} | (
        {} if args.units else {"rollout_unit": args.unit}
    )
    job = multitask_job(HOME, steps, **common)
    stack = stack_for(job, HOME, pools_for_job(job, training=True))
    print(
        f"end_to_end: {steps} steps x {repeats} repeats per mode, batch {args.batch_size}; starting the stack ...",
        flush=True,
    )
    with stack:
        runs = asyncio.run(_run(stack, steps, repeats, modes, common))
    rows = summarize(runs, DECLARED if args.placement else BASELINE)
    unit = "placed" if args.placement else "compared" if args.units else args.unit
    report(rows, steps, repeats, args.batch_size, unit, args.sokoban)
    return 0


async def _run(
    stack, steps: int, repeats: int, modes: dict[str, dict[str, object]], common: dict[str, object]
) -> dict[str, list[dict]]:
    """Every mode `repeats` times, interleaved; each mode's job is `common` with the mode's settings."""
    client = await connect(stack.temporal, stack.store)
    warm = multitask_job(HOME, 2, **common)
    await measure_job(client, warm, "warmup", HOME / "runs")  # first requests compile kernels, trainer warms up
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(repeats):
        for i, (name, settings) in enumerate(modes.items()):
            job = multitask_job(HOME, steps, **(common | settings))
            m = await measure_job(client, job, f"m{i}-r{r}", HOME / "runs", stack=stack)
            runs[name].append(m)
            print(
                f"  repeat {r + 1}/{repeats} {name:<20} {m['wall_s']:6.1f} s  {m['trajectories_per_s']:5.1f} traj/s  "
                f"gen busy {m['busy_generation']:.0%}  unit p99 {m.get('unit_p99_s', 0):.2f} s  "
                f"server {m.get('server_cpu_ms_per_traj', 0):.0f} ms/traj",
                flush=True,
            )
    return runs


COLUMNS = [
    ("name", "mode", ""),
    ("wall_s", "wall s", ".1f"),
    ("speedup_vs_baseline", "vs sync", ".2f"),
    ("trajectories_per_s", "traj/s", ".1f"),
    ("busy_generation", "gen busy", ".0%"),
    *[(f"busy_{p}", f"{p} busy", ".0%") for p in POOLS_REPORTED],
    ("dropped", "dropped", ".0f"),
    ("reset_max_s", "reset max s", ".2f"),
    ("unit_p99_s", "unit p99 s", ".2f"),
    ("placement", "placed (auto)", ""),
]
PROFILE = [
    ("name", "mode", ""),
    ("activities", "activities", ".0f"),
    ("wait_ms_p50", "wait ms", ".0f"),
    ("return_ms_p50", "return ms", ".0f"),
    ("generate_p50_s", "generate p50 s", ".3f"),
    ("cores_temporal-server", "server cores", ".2f"),
    ("server_cpu_ms_per_traj", "server ms/traj", ".0f"),
    ("cores_control", "control cores", ".2f"),
    ("cores_cpu", "cpu cores", ".2f"),
    ("cores_h800", "h800 cores", ".2f"),
    ("cores_h20", "h20 cores", ".2f"),
    ("cores_trainer", "trainer cores", ".2f"),
]


def report(rows: list[dict], steps: int, repeats: int, batch_size: int, unit: str, sokoban: bool = False) -> None:
    mix = "FrozenLake h800 + arithmetic h20" + (" + Sokoban h800" if sokoban else "")
    print(
        f"\nend_to_end: {steps} training steps of the multi-task job ({mix}), batch "
        f"{batch_size}, rollout_unit {unit}, medians of {repeats} repeat(s)"
    )
    for task, lat in [("FrozenLake", LATENCY)] + ([("Sokoban", SOKOBAN_LATENCY)] if sokoban else []):
        print(
            f"  {task} env latency (the fault model, TaskSpec.faults): reset median {lat['reset_median_s']} s / "
            f"p99 {lat['reset_p99_s']} s, step median {lat['step_median_s']} s / p99 {lat['step_p99_s']} s"
        )
    print(format_table(rows, COLUMNS))
    print("\n  where the time goes (medians): activities run, Temporal's queue wait and workflow-task return per")
    print("  activity, the median generate call, and CPU cores used by each process group (of 2, incl. children)")
    print(format_table(rows, PROFILE))
    if unit == "placed":
        print("  vs sync = here the declared placement's wall / this placement's (traj b1 throughout);")
    else:
        print("  vs sync = the synchronous baseline's wall / this mode's (paper: 1.35–2.05x end to end);")
    print("  unit p99 = the 99th percentile of a multi-turn episode's or group's workflow, start to close;")
    print("  busy = share of the wall time with at least one activity of that pool running (from the histories)")
    # one file per workload, so that each docs table (python -m bench tables) has its own
    suffix = {"trajectory": "-trajectory", "compared": "-units", "placed": "-placement"}.get(unit, "")
    name = "end_to_end" + ("-sokoban" if sokoban else "") + suffix
    path = write_results(
        name,
        rows,
        steps=steps,
        repeats=repeats,
        batch_size=batch_size,
        latency=LATENCY,
        baseline=DECLARED if unit == "placed" else BASELINE,
        paper_speedup=[1.35, 2.05],
        rollout_unit=unit,
        sokoban_latency=SOKOBAN_LATENCY if sokoban else None,
    )
    png = plot_modes(
        name,
        rows,
        f"end_to_end: {steps} steps, {mix}, batch {batch_size}",
        extra_key="trajectories_per_s",
        extra_label="trajectories/s",
    )
    print(f"\n  written: {path}, {png}")


__all__ = ["MODES", "PLACEMENT_MODES", "UNIT_MODES", "main"]
