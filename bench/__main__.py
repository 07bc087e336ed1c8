"""`python -m bench NAME [--quick] [options]`: run one benchmark, print its table, write bench/results/NAME.json."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

BENCHMARKS = {
    "resets": "bench.resets",
    "rollout": "bench.rollout",
    "weight_sync": "bench.weight_sync",
    "reward_service": "bench.reward_service",
}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("name", choices=sorted(BENCHMARKS), help="which benchmark")
    args, rest = parser.parse_known_args()
    module = importlib.import_module(BENCHMARKS[args.name])
    rc = module.main(rest)
    sys.stdout.flush()
    os._exit(rc)  # dodge the SDK's known crash at interpreter exit


if __name__ == "__main__":
    main()
