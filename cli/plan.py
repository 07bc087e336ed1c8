"""`rollart plan`: which generation pool each task should use, and (given a step time) how many engines each pool
needs, from a finished or running run's token profile. `rollart k8s plan` prints the same with the pool sizes as
the job's `kubernetes.pools` replicas."""

from __future__ import annotations

import argparse
from pathlib import Path

from rollart.cli.errors import UserError
from rollart.cli.spec import read_spec

__all__ = ["add_args", "add_parser", "run", "run_k8s"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `plan` and its flags."""
    s = sub.add_parser(
        "plan",
        help="place each task on the generation pool that shortens a step, from a run's token profile",
        description=__doc__,
    )
    add_args(s)
    s.set_defaults(func=run)


def add_args(s: argparse.ArgumentParser) -> None:
    """The flags `plan` and `k8s plan` share."""
    s.add_argument("job", type=Path, help="job spec (YAML or JSON): its tasks, pools and their GPUs")
    s.add_argument(
        "--profile", type=Path, required=True, metavar="RUN_DIR", help="a run dir of the job (its metrics.jsonl)"
    )
    s.add_argument("--last", type=int, help="profile only the last N steps (the policy's lengths drift)")
    s.add_argument(
        "--params",
        type=float,
        default=7e9,
        help="parameters of the model to plan for (default 7e9; a run of the tiny model stands for it)",
    )
    s.add_argument("--engines", default="", metavar="POOL=N,...", help="engines per pool (default: replicas, or 1)")
    s.add_argument(
        "--rates",
        default="",
        metavar="POOL=PREFILL:DECODE,...",
        help="measured tokens/s per engine, instead of the GPU's roofline",
    )
    s.add_argument("--step-s", type=float, help="a step's generation time to size the pools for")


def run(args: argparse.Namespace) -> int:
    """Print the profile, the rates, the plan against the declared placement, and pool sizes if asked."""
    report = _report(args)
    print("\n".join(report.lines()))
    return 0


def run_k8s(args: argparse.Namespace) -> int:
    """As `plan`, then the pool sizes as the job's `kubernetes.pools` section."""
    if args.step_s is None:
        raise UserError("k8s plan sizes the pools for a step time: give --step-s")
    report = _report(args)
    print("\n".join(report.lines()))
    print("\nkubernetes:\n  pools:")
    for pool, n in (report.sizes or {}).items():
        print(f"    {pool}: {{replicas: {max(1, n)}}}")
    return 0


def _report(args: argparse.Namespace):
    from rollart.client.placement_plan import job_rates, plan_from_run

    job = read_spec(args.job)
    try:
        rates = job_rates(job, args.params, _pairs(args.engines, int), _pairs(args.rates, _rate))
        return plan_from_run(job, args.profile, rates, step_s=args.step_s, last=args.last)
    except (FileNotFoundError, ValueError) as e:
        raise UserError(str(e)) from e


def _rate(text: str) -> tuple[float, float]:
    prefill, _, decode = text.partition(":")
    return float(prefill), float(decode)


def _pairs(text: str, parse):
    out = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        pool, eq, value = item.partition("=")
        try:
            out[pool] = parse(value) if eq else None
        except ValueError:
            out[pool] = None
        if out[pool] is None:
            raise UserError(f"{item!r}: expected POOL=VALUE (e.g. h800=2, or h800=40000:2000 for --rates)")
    return out
