"""`python -m bench simulate`: the cluster simulator's command (docs/simulator.md).

Default (`--paper`): the paper-like 3,000-GPU setup for one simulated hour in each mode — synchronous (batch
mode, bound 0) against trajectory-level async (bounds 1, 2) — plus the alternative pool assignment and the
`turns` priority, each compared on the same hour. `--placement`: the hand-written pool assignments against
`generate_pool: auto` placed at run time; `--priority`: the engines' queue order (fifo, turns, predicted) at
256 and at 8 sequences per engine. `--calibrate`: this machine's end_to_end job at its own
scale, predicted against the measured bench/results/end_to_end*.json. `--timing`: one full-scale hour of one
mode, to measure the simulator's own speed. Results go to bench/results/simulate.json (each part its key).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from bench.report import RESULTS, format_table, write_results
from bench.simulate.setups import MODES, calibration, paper
from rollart.simulator.run import Setup, simulate

__all__ = ["main"]

NAME = "simulate"
BASELINE = "batch b0 (sync)"
VERL_SYNC = "traj b0 (sync, no phase barrier)"
"""The paper's synchronous baseline: a whole batch rolled out (each trajectory on its own), then trained."""
PAPER_RANGE = (1.31, 2.05)

COLUMNS = [
    ("name", "run", ""),
    ("sim_s", "sim s", ".0f"),
    ("steps", "steps", ".0f"),
    ("step_s", "step s", ".1f"),
    ("trained_per_s", "trained/s", ".1f"),
    ("vs_sync", "vs sync", ".2f"),
    ("vs_traj_sync", "vs traj b0", ".2f"),
    ("trajectory_p99_s", "traj p99 s", ".1f"),
    ("busy_h800", "h800 busy", ".0%"),
    ("busy_h20", "h20 busy", ".0%"),
    ("busy_trainer", "trainer busy", ".0%"),
    ("dropped", "dropped", ".0f"),
    ("failed", "failed", ".0f"),
    ("ledger_balanced", "ledger ok", ""),
    ("wall_s", "wall s", ".1f"),
]
TEMPORAL = [
    ("name", "run", ""),
    ("temporal_events_per_s", "events/s", ",.0f"),
    ("temporal_actions_per_s", "actions/s", ",.0f"),
    ("temporal_signals_per_s", "signals/s", ".1f"),
    ("temporal_units_per_s", "workflows/s", ".1f"),
    ("parent_events_per_step", "parent events/step", ",.0f"),
    ("parent_runs_per_hour", "parent runs/h", ".1f"),
]
"""What each run asks of Temporal (estimates priced by `bench temporal`'s measurements: simulator/temporal_load.py)."""

CALIBRATION = [
    ("name", "mode", ""),
    ("predicted_s", "sim s", ".1f"),
    ("measured_s", "measured s", ".1f"),
    ("predicted_ratio", "sim vs sync", ".2f"),
    ("measured_ratio", "measured vs sync", ".2f"),
    ("ratio_error", "ratio error", "+.0%"),
    ("wall_error", "time error", "+.0%"),
    ("calls", "sim activities", ".0f"),
    ("measured_activities", "measured", ".0f"),
]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench simulate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--paper", action="store_true", help="the paper-like comparisons (the default)")
    what.add_argument("--calibrate", action="store_true", help="predict this machine's end_to_end runs")
    what.add_argument("--timing", action="store_true", help="one mode, full scale: the simulator's own speed")
    what.add_argument(
        "--placement",
        action="store_true",
        help="automatic affinity: spec/placement.py's choice for the paper-like setup against the hand-written ones",
    )
    what.add_argument(
        "--priority",
        action="store_true",
        help="traj b1 with engine.priority fifo, turns and predicted, at the default max_num_seqs and at 8 per engine",
    )
    what.add_argument(
        "--units",
        action="store_true",
        help="traj b1 with the multi-turn tasks as lockstep groups, free members and episodes, against batch b0",
    )
    parser.add_argument("--hours", type=float, default=1.0, help="simulated hours per run (default 1)")
    parser.add_argument("--scale", type=float, default=1.0, help="GPUs and batch x this (default 1: 3,008 GPUs)")
    parser.add_argument(
        "--unit",
        choices=["trajectory", "group", "free"],
        default="group",
        help="the multi-turn tasks' rollout_unit: group (the coarser, faster default: a group's 8 members share "
        "each generate_batch/step_group), free (a group whose members play free of lockstep, each with its own "
        "calls) or trajectory (an episode each, ~6x the calls)",
    )
    parser.add_argument(
        "--every", type=int, default=3, help="--placement: the auto run re-plans every this many steps (default 3)"
    )
    parser.add_argument("--mode", default="traj b1", choices=list(MODES), help="--timing's mode (default traj b1)")
    parser.add_argument("--sokoban", action="store_true", help="--calibrate: the Sokoban mix (end_to_end-sokoban)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="--calibrate: seeds per mode, the median kept")
    parser.add_argument(
        "--cores", type=int, default=1, help="--calibrate: cores the Temporal server and control worker get (default 1)"
    )
    parser.add_argument("--quick", action="store_true", help="--paper at scale 0.05 for 15 minutes (~1 min here)")
    args = parser.parse_args(argv)
    if args.calibrate:
        return _calibrate(args.sokoban, args.seed, args.cores, args.repeats)
    if args.timing:
        return _timing(args)
    if args.units:
        return _units(args)
    if args.placement:
        return _placement(args)
    if args.priority:
        return _priority(args)
    if args.quick:
        args.scale, args.hours = 0.05, 0.25
    return _paper(args)


# ---------------------------------------------------------------- runs


def _run(setup: Setup, progress: bool = True) -> dict[str, Any]:
    every = 600.0 if setup.horizon_s and setup.horizon_s > 1200 else None
    _, row = simulate(setup, progress_every_s=every if progress else None)
    p99 = row["trajectory_p99_s"] or 0.0
    print(
        f"  {setup.name:<28} {row['sim_s']:7.0f} sim s  {row['steps']:4d} steps  "
        f"{row['trained_per_s']:7.1f} trained/s  p99 {p99:6.1f} s  wall {row['wall_s']:6.1f} s",
        flush=True,
    )
    return row


def _paper(args: argparse.Namespace) -> int:
    horizon = args.hours * 3600.0
    runs: list[tuple[str, dict[str, Any]]] = [
        (name, {"mode": mode, "bound": bound}) for name, (mode, bound) in MODES.items()
    ]
    runs += [
        (VERL_SYNC, {"mode": "trajectory", "bound": 0}),
        ("traj b1, pools swapped", {"mode": "trajectory", "bound": 1, "swap_pools": True}),
        ("traj b1, priority turns", {"mode": "trajectory", "bound": 1, "priority": "turns"}),
        ("traj b1, 8 seqs/engine, fifo", {"mode": "trajectory", "bound": 1, "max_num_seqs": 8}),
        ("traj b1, 8 seqs/engine, turns", {"mode": "trajectory", "bound": 1, "max_num_seqs": 8, "priority": "turns"}),
        ("traj b0, 1/4 generation GPUs", {"mode": "trajectory", "bound": 0, "gen_share": 0.25}),
        ("traj b1, 1/4 generation GPUs", {"mode": "trajectory", "bound": 1, "gen_share": 0.25}),
    ]
    print(
        f"simulate --paper: {len(runs)} runs of {args.hours:g} simulated hour(s), scale {args.scale:g}, "
        f"multi-turn unit {args.unit}",
        flush=True,
    )
    rows = []
    for name, kw in runs:
        setup = paper(
            kw.pop("mode"), kw.pop("bound"), horizon_s=horizon, scale=args.scale, unit=args.unit, seed=args.seed, **kw
        )
        row = _run(setup)
        row["name"] = name
        rows.append(row)
    base = next(r for r in rows if r["name"] == BASELINE)
    verl = next(r for r in rows if r["name"] == VERL_SYNC)
    for r in rows:
        r["vs_sync"] = r["trained_per_s"] / base["trained_per_s"] if base["trained_per_s"] else None
        r["vs_traj_sync"] = r["trained_per_s"] / verl["trained_per_s"] if verl["trained_per_s"] else None
    print(f"\nsimulate --paper: {rows[0]['gpus']:,} GPUs, {args.hours:g} h each (vs sync: trained samples per second)")
    print(format_table(rows, COLUMNS))
    print("\nwhat each run asks of Temporal (estimated from bench temporal's measured costs):")
    print(format_table(rows, TEMPORAL))
    for key, against in (("vs_sync", BASELINE), ("vs_traj_sync", VERL_SYNC)):
        asyncs = [r[key] for r in rows if r["name"] in ("traj b1", "traj b2")]
        inside = all(PAPER_RANGE[0] <= x <= PAPER_RANGE[1] for x in asyncs)
        print(
            f"  traj b1, b2 vs {against}: {', '.join(f'{x:.2f}x' for x in asyncs)}; the paper reports "
            f"{PAPER_RANGE[0]}–{PAPER_RANGE[1]}x: {'inside' if inside else 'outside'} that range"
        )
    _save(
        "paper",
        rows,
        hours=args.hours,
        scale=args.scale,
        unit=args.unit,
        seed=args.seed,
        paper_speedup=list(PAPER_RANGE),
    )
    return 0


UNIT_RUNS = {
    "batch b0 (sync), lockstep groups": ("batch", 0, "group"),
    "traj b1, lockstep groups": ("trajectory", 1, "group"),
    "traj b1, free members": ("trajectory", 1, "free"),
    "traj b1, episodes": ("trajectory", 1, "trajectory"),
}
"""`--units`: the rollout unit of the multi-turn tasks under trajectory-level asynchrony (bench end_to_end --units
at the paper's scale)."""


def _units(args: argparse.Namespace) -> int:
    """Each unit on the same simulated hours and seed; trained samples per second against the sync baseline."""
    horizon = args.hours * 3600.0
    print(f"simulate --units: {len(UNIT_RUNS)} runs of {args.hours:g} simulated hour(s), scale {args.scale:g}")
    rows = []
    for name, (mode, bound, unit) in UNIT_RUNS.items():
        row = _run(paper(mode, bound, horizon_s=horizon, scale=args.scale, unit=unit, seed=args.seed))
        row["name"] = name
        rows.append(row)
    base = rows[0]["trained_per_s"]
    for r in rows:
        r["vs_sync"] = r["trained_per_s"] / base if base else None
    print(format_table(rows, COLUMNS))
    _save("units", rows, hours=args.hours, scale=args.scale, seed=args.seed)
    return 0


def _where(assignment: dict[str, str]) -> str:
    """A placement in a few words: "frozenlake h800, sokoban h800, arithmetic h20"."""
    return ", ".join(f"{task} {pool}" for task, pool in assignment.items())


def _placement(args: argparse.Namespace) -> int:
    """The planner's placement and the hand-written ones: its predicted step, and traj b1 simulated on each; then
    every task `generate_pool: auto`, placed at run time from the engines' measured rates (workflows/training/
    placement.py), from its spread and from the swapped placement."""
    from bench.simulate.placement import HAND_WRITTEN, planned

    chosen, hand = planned(args.scale)
    horizon = args.hours * 3600.0
    print(
        f"simulate --placement: scale {args.scale:g}, traj b1, {args.hours:g} simulated hour(s) per placement, "
        f"auto re-planned every {args.every} steps",
        flush=True,
    )
    rows = []
    for name, assignment in HAND_WRITTEN.items():
        setup = paper(
            "trajectory",
            1,
            horizon_s=horizon,
            scale=args.scale,
            unit=args.unit,
            swap_pools=name == "swapped",
            seed=args.seed,
        )
        row = _run(setup)
        row |= {
            "name": name,
            "predicted_step_s": hand[name].makespan_s,
            "chosen": assignment == chosen.assignment,
            "placement_end": dict(assignment),
        }
        rows.append(row)
    autos = {
        f"auto, every {args.every} steps": None,
        f"auto, every {args.every} steps, from swapped": HAND_WRITTEN["swapped"],
    }
    for name, start in autos.items():
        setup = paper(
            "trajectory",
            1,
            horizon_s=horizon,
            scale=args.scale,
            unit=args.unit,
            seed=args.seed,
            auto_every=args.every,
            start_placement=start,
        )
        row = _run(setup)
        row |= {"name": name, "predicted_step_s": None, "chosen": False, "auto": True}
        rows.append(row)
    best = max(r["trained_per_s"] for r in rows if not r.get("auto"))
    for r in rows:
        r["vs_best"] = r["trained_per_s"] / best
        r["where"] = _where(r["placement_end"])
    picked = next((r for r in rows if r["chosen"]), None)
    print(
        format_table(
            rows,
            [
                ("name", "placement", ""),
                ("predicted_step_s", "planned step s", ".2f"),
                ("trained_per_s", "trained/s", ".1f"),
                ("vs_best", "vs best hand-written", ".2f"),
                ("placement_moves", "moves", ".0f"),
                ("where", "at the end", ""),
            ],
        )
    )
    print(f"  the planner chose {chosen.assignment}: " + (f"the {picked['name']} placement" if picked else "neither"))
    for r in rows:
        for t in r.get("placement_timeline", []):
            print(f"  {r['name']}: step {t['step']:3d} ({t['sim_s']:6.0f} s): {_where(t['assignment'])}")
        if r.get("auto"):
            print(f"  {r['name']}: measured rates (engines, prefill, decode tok/s): {r['placement_rates']}")
    _save("placement", rows, hours=args.hours, scale=args.scale, chosen=chosen.assignment, every=args.every)
    return 0


PRIORITIES = ("fifo", "turns", "predicted")
PRIORITY_SEQS = (256, 8)
"""`--priority`: each engine.priority at vLLM's default max_num_seqs (no request waits here) and at 8 a engine."""


def _priority(args: argparse.Namespace) -> int:
    """traj b1 under each engine.priority, at each max_num_seqs: the same hours and seed; trained samples per
    second and the trajectories' tail against fifo's at the same max_num_seqs."""
    horizon = args.hours * 3600.0
    print(
        f"simulate --priority: {len(PRIORITIES) * len(PRIORITY_SEQS)} runs of {args.hours:g} simulated hour(s), "
        f"scale {args.scale:g}, multi-turn unit {args.unit}",
        flush=True,
    )
    rows = []
    for seqs in PRIORITY_SEQS:
        for priority in PRIORITIES:
            setup = paper(
                "trajectory",
                1,
                horizon_s=horizon,
                scale=args.scale,
                unit=args.unit,
                seed=args.seed,
                priority=priority,
                max_num_seqs=seqs,
            )
            row = _run(setup)
            row |= {"name": f"{seqs} seqs/engine, {priority}", "priority": priority, "max_num_seqs": seqs}
            rows.append(row)
    for r in rows:
        fifo = next(x for x in rows if x["max_num_seqs"] == r["max_num_seqs"] and x["priority"] == "fifo")
        r["vs_fifo"] = r["trained_per_s"] / fifo["trained_per_s"] if fifo["trained_per_s"] else None
        p99, fifo_p99 = r["trajectory_p99_s"], fifo["trajectory_p99_s"]
        r["p99_vs_fifo"] = p99 / fifo_p99 if p99 and fifo_p99 else None
    print(
        format_table(
            rows,
            [
                ("name", "run", ""),
                ("steps", "steps", ".0f"),
                ("trained_per_s", "trained/s", ".1f"),
                ("vs_fifo", "vs fifo", ".3f"),
                ("trajectory_p50_s", "traj p50 s", ".1f"),
                ("trajectory_p99_s", "traj p99 s", ".1f"),
                ("p99_vs_fifo", "p99 vs fifo", ".3f"),
                ("busy_h800", "h800 busy", ".0%"),
                ("busy_h20", "h20 busy", ".0%"),
            ],
        )
    )
    _save("priority", rows, hours=args.hours, scale=args.scale, unit=args.unit, seed=args.seed)
    return 0


def _timing(args: argparse.Namespace) -> int:
    mode, bound = MODES[args.mode]
    setup = paper(mode, bound, horizon_s=args.hours * 3600.0, scale=args.scale, unit=args.unit, seed=args.seed)
    print(f"simulate --timing: {args.mode}, {args.hours:g} simulated hour(s), scale {args.scale:g}, unit {args.unit}")
    t0 = time.perf_counter()
    row = _run(setup)
    row["name"] = f"{args.mode}, unit {args.unit}"
    row["wall_per_sim_hour_s"] = (time.perf_counter() - t0) * 3600.0 / row["sim_s"]
    row["cpu_per_sim_hour_s"] = row["cpu_s"] * 3600.0 / row["sim_s"]
    row["peak_in_flight"] = setup.plan.training.in_flight_limit
    print(
        f"  {row['gpus']:,} GPUs, up to {row['peak_in_flight']:,} trajectories in flight or buffered: "
        f"{row['wall_per_sim_hour_s'] / 60:.1f} wall min ({row['cpu_per_sim_hour_s'] / 60:.1f} CPU min) per "
        f"simulated hour ({row['calls']:,} calls)"
    )
    _save(f"timing {args.unit}", [row])
    return 0


def _calibrate(sokoban: bool, seed: int, cores: int, repeats: int) -> int:
    name = "end_to_end-sokoban" if sokoban else "end_to_end"
    measured_doc = json.loads((RESULTS / f"{name}.json").read_text())
    measured = {m["name"]: m for m in measured_doc["modes"]}
    steps = measured_doc["steps"]
    print(f"simulate --calibrate: {name}'s job, {steps} steps, this machine's scale", flush=True)
    rows = []
    for label, (mode, bound) in MODES.items():
        runs = [
            _run(calibration(mode, bound, steps=steps, sokoban=sokoban, seed=seed + r, cores=cores), progress=False)
            for r in range(repeats)
        ]
        row = sorted(runs, key=lambda x: x["sim_s"])[len(runs) // 2]  # the median run, as end_to_end reports
        m = measured[label]
        rows.append({"predicted_s": row["sim_s"], "measured_s": m["wall_s"], **row, "name": label})
        rows[-1]["predicted_walls_s"] = [x["sim_s"] for x in runs]
        rows[-1]["measured_walls_s"] = m.get("walls_s")
        rows[-1]["measured_activities"] = m.get("activities")
    base = rows[0]
    for r in rows:
        r["predicted_ratio"] = base["predicted_s"] / r["predicted_s"]
        r["measured_ratio"] = base["measured_s"] / r["measured_s"]
        r["ratio_error"] = r["predicted_ratio"] / r["measured_ratio"] - 1.0
        r["wall_error"] = r["predicted_s"] / r["measured_s"] - 1.0
    print(f"\nsimulate --calibrate: predicted vs measured ({name}.json), ratio = sync's time / the mode's")
    print(format_table(rows, CALIBRATION))
    worst = max(abs(r["ratio_error"]) for r in rows)
    print(f"  worst ratio error {worst:.0%} (goal: within 15 %)")
    _save(f"calibration {name}", rows, cores=cores, repeats=repeats)
    return 0


def _save(key: str, rows: list[dict[str, Any]], **extra: Any) -> None:
    """Into bench/results/simulate.json under `key`, beside what other parts wrote; the paper part is `modes`."""
    path = RESULTS / f"{NAME}.json"
    doc = json.loads(path.read_text()) if path.exists() else {}
    parts = doc.get("parts", {})
    parts[key] = {"rows": rows, **extra}
    modes = rows if key == "paper" else doc.get("modes", [])
    out = write_results(NAME, modes, parts=parts)
    print(f"  written: {out} ({key})")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
