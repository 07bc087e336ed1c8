"""`python -m bench NAME [--quick] [options]` or `python -m bench all [--quick]`: run benchmarks, print tables,
write bench/results/NAME.json (+ NAME.png)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import time

BENCHMARKS = {
    "end_to_end": "bench.end_to_end",
    "affinity": "bench.affinity",
    "overhead": "bench.overhead",
    "resets": "bench.resets",
    "rollout": "bench.rollout",
    "weight_sync": "bench.weight_sync",
    "reward_service": "bench.reward_service",  # listed only where its module exists (import guarded)
}
ALL = ["end_to_end", "affinity", "overhead", "weight_sync", "reward_service"]
"""What `all` runs, in order (`rollout` is the older single-mode throughput probe: run it by name)."""


def available() -> dict[str, str]:
    """The benchmarks whose module is present (reward_service came from another branch)."""
    return {k: m for k, m in BENCHMARKS.items() if importlib.util.find_spec(m) is not None}


def main() -> None:
    found = available()
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("name", choices=[*sorted(found), "all"], help="which benchmark, or all of them")
    args, rest = parser.parse_known_args()
    if args.name == "all":
        rc = run_all([n for n in ALL if n in found], rest)
    else:
        rc = importlib.import_module(found[args.name]).main(rest)
    sys.stdout.flush()
    os._exit(rc)  # dodge the SDK's known crash at interpreter exit


def run_all(names: list[str], rest: list[str]) -> int:
    """Each benchmark in its own process (each starts and stops its own stack); `rest` (e.g. --quick) to all."""
    import subprocess

    missing = [n for n in ALL if n not in names]
    if missing:
        print(f"all: skipping {', '.join(missing)} (module not present on this branch)", flush=True)
    failed = []
    for name in names:
        print(f"\n===== {name} {' '.join(rest)} =====", flush=True)
        t0 = time.monotonic()
        rc = subprocess.call([sys.executable, "-m", "bench", name, *rest])
        print(f"===== {name}: rc {rc}, {time.monotonic() - t0:.0f} s =====", flush=True)
        if rc:
            failed.append(name)
    if failed:
        print(f"all: failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    main()
