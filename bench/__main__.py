"""`python -m bench NAME [--quick] [options]` or `python -m bench all [--quick]`: run benchmarks, print tables,
write bench/results/NAME.json (+ NAME.png). `python -m bench tables [--check]` writes the docs' tables from them."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time

BENCHMARKS = {
    "end_to_end": "bench.end_to_end",
    "affinity": "bench.affinity",
    "engines": "bench.engines",
    "overhead": "bench.overhead",
    "resets": "bench.resets",
    "rollout": "bench.rollout",
    "weight_sync": "bench.weight_sync",
    "reward_service": "bench.reward_service",
    "trainer": "bench.trainer",
    "trainer_memory": "bench.trainer_memory",
    "trainer_packing": "bench.trainer_packing",
    "gpu": "bench.gpu",
    "single_turn": "bench.single_turn",
    "peer_trl": "bench.peer_trl",
    "scale": "bench.scale",
    "temporal": "bench.temporal_limits",
    "learning": "bench.learning",
    "learning_standin": "bench.learning_standin",
    "size": "bench.size",
    "lora_swap": "bench.lora_swap",
    "turns": "bench.turns",
    "sft": "bench.sft",
    "priority": "bench.priority",
    "sandbox": "bench.sandbox",
    "simulate": "bench.simulate.cli",
}
TOOLS = {"tables": "bench.tables"}
"""Not benchmarks: `tables` rewrites the measured tables of docs/*.md from bench/results/*.json."""
ALL = ["end_to_end", "affinity", "overhead", "weight_sync", "reward_service"]
"""What `all` runs, in order (`rollout` is the older single-mode throughput probe: run it by name)."""


def main() -> None:
    # `-h` only as the first argument: after a benchmark's name it is that benchmark's own --help
    own_help = sys.argv[1:2] in ([], ["-h"], ["--help"])
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__, add_help=own_help)
    parser.add_argument(
        "name", choices=[*sorted(BENCHMARKS), "all", *TOOLS], help="which benchmark, or all of them; or tables"
    )
    args, rest = parser.parse_known_args()
    modules = {**BENCHMARKS, **TOOLS}
    rc = run_all(ALL, rest) if args.name == "all" else importlib.import_module(modules[args.name]).main(rest)
    sys.stdout.flush()
    os._exit(rc)  # dodge the SDK's known crash at interpreter exit


def run_all(names: list[str], rest: list[str]) -> int:
    """Each benchmark in its own process (each starts and stops its own stack); `rest` (e.g. --quick) to all.
    Ends with every benchmark's modes side by side: wall time and ratio to its baseline."""
    import subprocess

    failed, took = [], {}
    for name in names:
        print(f"\n===== {name} {' '.join(rest)} =====", flush=True)
        t0 = time.monotonic()
        rc = subprocess.call([sys.executable, "-m", "bench", name, *rest])
        took[name] = time.monotonic() - t0
        print(f"===== {name}: rc {rc}, {took[name]:.0f} s =====", flush=True)
        if rc:
            failed.append(name)
    print(summary([n for n in names if n not in failed], took))
    if failed:
        print(f"all: failed: {', '.join(failed)}")
    return 1 if failed else 0


def summary(names: list[str], took: dict[str, float]) -> str:
    """One line per mode of each benchmark's results file: median wall and ratio to that benchmark's baseline."""
    from bench.report import RESULTS, format_table

    rows = []
    for name in names:
        modes = json.loads((RESULTS / f"{name}.json").read_text()).get("modes", [])
        for i, m in enumerate(modes):
            rows.append(
                {
                    "mode": f"{name}: {m['name']}",
                    "wall_s": m.get("wall_s"),
                    "ratio": m.get("speedup_vs_baseline"),
                    "took": took[name] if i == 0 else None,
                }
            )
    table = format_table(
        rows,
        [
            ("mode", "benchmark: mode", ""),
            ("wall_s", "wall s", ".3g"),
            ("ratio", "vs baseline", ".2f"),
            ("took", "bench took s", ".0f"),
        ],
    )
    return f"\n===== all: every mode against its benchmark's baseline (bench/results/NAME.json) =====\n{table}"


if __name__ == "__main__":
    main()
