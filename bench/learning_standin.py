"""The learning dynamics of an example without the system: many seeds of the same recipe in seconds each.

`python -m bench learning_standin --bounds 0,1 --seeds 10 [--set trainer.lr=0.0005 ...]` runs the
stand-in (`rollart.client.standin`: the trainer's own code in one process, sampling from the model with the
weights of step k − bound) over bounds and seeds, and writes each run's curve to bench/results.

What it is for: ranking recipes over many seeds (each seed is also the sampling seed, so a run repeats
exactly), and telling a recipe's sensitivity to staleness from a fault of the system. It is not the
measurement of the product: `python -m bench learning` runs the example on the real stack.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from bench.learning import bench_job
from bench.report import RESULTS
from rollart.client.standin import run_one
from rollart.infra.tiny_model import ensure_tiny_model

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench learning_standin", description=__doc__)
    ap.add_argument("--example", default="frozenlake")
    ap.add_argument("--bounds", default="0,1")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--target", type=float, default=0.8)
    ap.add_argument("--window", type=int, default=5)
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE over the example (as bench learning)")
    ap.add_argument("--out", default=None, help="results file (default bench/results/learning-standin-EXAMPLE.json)")
    args = ap.parse_args(argv)
    spec = bench_job(args.example, args.set, None)
    ensure_tiny_model(Path(spec.model_dir))
    torch.set_num_threads(1)
    runs = []
    for bound in [int(b) for b in args.bounds.split(",")]:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            t0 = time.monotonic()
            r = run_one(spec, bound, seed, args.steps, args.target, args.window)
            r["minutes"] = (time.monotonic() - t0) / 60
            runs.append(r)
            print(
                f"bound {bound} seed {seed}: to {args.target}: {r['steps_to_target']}, "
                f"last 20 mean {statistics.mean(r['curve'][-20:]):.2f} ({r['minutes']:.1f} min)",
                flush=True,
            )
    out = Path(args.out) if args.out else RESULTS / f"learning-standin-{args.example}.json"
    out.write_text(json.dumps({"sets": args.set, "runs": runs}))
    for bound in sorted({r["bound"] for r in runs}):
        rs = [r for r in runs if r["bound"] == bound]
        hit = [r["steps_to_target"] for r in rs if r["steps_to_target"] is not None]
        med = statistics.median(hit) if hit else None
        print(f"bound {bound}: {len(hit)}/{len(rs)} reach {args.target}, median steps {med}")
    return 0
