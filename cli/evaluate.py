"""`rollart eval`: a policy version's greedy success rate on held-out seeds, in one process (no Temporal)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from rollart.cli.errors import UserError
from rollart.cli.model import ensure_model
from rollart.cli.spec import load_spec

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `eval` and its flags."""
    s = sub.add_parser("eval", help="a policy version's greedy success rate on held-out seeds (no Temporal needed)")
    s.add_argument("job", type=Path, help="job spec (YAML or JSON): its tasks, model dir and store")
    s.add_argument("--job-id", help="the training job whose published weights to load (default: the untrained model)")
    s.add_argument("--version", type=int, help="policy version to load (default: the job's latest)")
    s.add_argument(
        "--run-dir",
        type=Path,
        help="load a checkpoint instead: the run dir's newest (or --step's), or a checkpoint dir (full or LoRA)",
    )
    s.add_argument("--step", type=int, help="with --run-dir: the checkpoint of this train step")
    s.add_argument(
        "--model-dir", type=Path, help="evaluate this model dir instead of the job's model_dir (e.g. `rollart sft`'s)"
    )
    s.add_argument("--task", action="append", help="task name(s) to evaluate (default: every task)")
    s.add_argument("-n", "--episodes", type=int, default=200, help="held-out episodes per task (default 200)")
    s.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); the task's own to compare")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """One row per task: version, episodes, success rate and mean reward."""
    from rollart.client.evaluate import evaluate

    job = load_spec(args.job, args)
    if args.episodes < 1:
        raise UserError(f"--episodes must be at least 1, got {args.episodes}")
    if args.run_dir is not None and (args.job_id or args.version is not None):
        raise UserError("give --run-dir (a checkpoint) or --job-id/--version (a published version), not both")
    if args.step is not None and args.run_dir is None:
        raise UserError("--step picks a checkpoint of --run-dir: give --run-dir too")
    try:
        tasks = [job.task(name) for name in args.task] if args.task else job.tasks
    except KeyError as e:
        raise UserError(str(e.args[0])) from e
    ensure_model(job, str(args.job))
    print(
        f"{'task':<16} {'version':>7} {'episodes':>8} {'success':>8} {'reward':>8}  (temperature {args.temperature:g})"
    )
    for task in tasks:
        try:
            r = asyncio.run(
                evaluate(
                    job,
                    task,
                    args.job_id,
                    args.version,
                    args.episodes,
                    args.temperature,
                    checkpoint=args.run_dir,
                    step=args.step,
                )
            )
        except ValueError as e:
            raise UserError(str(e)) from e
        failed = f"  ({r.failed} episode(s) failed, not counted)" if r.failed else ""
        print(f"{r.task:<16} {r.version:>7} {r.episodes:>8} {r.success_rate:>8.3f} {r.reward_mean:>8.3f}{failed}")
    return 0
