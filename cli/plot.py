"""`rollart plot`: learning-curve and rollout-timeline PNGs for a run dir, or one plot comparing several."""

from __future__ import annotations

import argparse
from pathlib import Path

from rollart.cli.errors import UserError

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `plot` and its flags."""
    s = sub.add_parser("plot", help="write learning-curve and rollout-timeline PNGs for a run dir, or compare runs")
    s.add_argument(
        "run_dirs",
        type=Path,
        nargs="+",
        metavar="RUN_DIR",
        help="a `rollart train` run dir (holds metrics.jsonl); several: one comparison plot",
    )
    s.add_argument("--out", type=Path, help="comparison PNG (default: compare.png in the first run dir)")
    s.add_argument("--labels", help="comma-separated legend labels for the compared runs (default: dir names)")
    s.add_argument("--smooth", type=int, default=5, help="moving-average window in steps for compared curves")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Plot one run's curves and timeline, or compare several runs' curves in one PNG."""
    from rollart.client.plot import compare_runs, plot_run

    labels = args.labels.split(",") if args.labels else [d.name for d in args.run_dirs]
    if len(labels) != len(args.run_dirs):
        raise UserError(f"--labels has {len(labels)} labels for {len(args.run_dirs)} run dirs")
    try:
        if len(args.run_dirs) == 1:
            paths = plot_run(args.run_dirs[0])
        else:
            out = args.out or args.run_dirs[0] / "compare.png"
            paths = [compare_runs(args.run_dirs, labels, out, smooth=args.smooth)]
    except FileNotFoundError as e:
        raise UserError(str(e)) from e
    for path in paths:
        print(f"wrote {path}")
    return 0
