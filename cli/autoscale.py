"""`rollart autoscale`: scale an elastic pool's local worker processes with its queue's backlog."""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from rollart.cli.errors import UserError
from rollart.cli.spec import add_temporal_args, default_job, override, read_spec
from rollart.cli.stack import home
from rollart.cli.worker import check_store

if TYPE_CHECKING:
    from rollart.spec.config import JobSpec

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `autoscale`; its scaling flags override the job's `pools.<pool>` section."""
    s = sub.add_parser(
        "autoscale",
        help="scale an elastic pool's local worker processes with its queue's backlog",
        description="Read the pool's activity backlog from Temporal every few seconds and start or "
        "stop local `rollart worker` processes between --min and --max (SIGTERM: they drain first). "
        "Decisions are logged. Defaults come from the job's pools.<pool> section.",
    )
    s.add_argument("--pool", default="serverless", help="the elastic (reward) pool to scale (default serverless)")
    s.add_argument("--job", type=Path, help="job spec to take the store, Temporal and scaling settings from")
    add_temporal_args(s)
    s.add_argument("--min", type=int, dest="min_workers", help="fewest workers, may be 0 (default: the job's, else 1)")
    s.add_argument("--max", type=int, dest="max_workers", help="most workers (default: the job's, else 4)")
    s.add_argument(
        "--concurrency",
        type=int,
        dest="max_concurrent_activities",
        help="activities one worker runs at once (default 16)",
    )
    s.add_argument(
        "--backlog-per-worker", type=int, help="backlog that asks for one more worker (default: --concurrency)"
    )
    s.add_argument(
        "--scale-up-cooldown", type=float, dest="scale_up_cooldown_s", help="seconds between scale-ups (default 6)"
    )
    s.add_argument(
        "--scale-down-cooldown",
        type=float,
        dest="scale_down_cooldown_s",
        help="seconds the queue must want fewer workers before they stop (default 30)",
    )
    s.add_argument(
        "--poll-interval", type=float, dest="poll_interval_s", help="seconds between backlog reads (default 2)"
    )
    s.add_argument("--store-path", type=Path, help="payload store directory (must be shared with every worker)")
    s.add_argument("--home", type=Path, help="where worker settings and logs go (default .rollart)")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Scale until SIGTERM/Ctrl-C, then stop the workers it started (each drains first)."""
    from rollart.workers.autoscaler import Autoscaler, WorkerProcesses
    from rollart.workers.settings import WorkerSettings

    declared = read_spec(args.job) if args.job else default_job()
    pool = _elastic_pool(declared, args.pool)
    job = override(declared, args, str(args.job) if args.job else None)
    cfg = job.elastic(pool)
    settings = WorkerSettings.from_job(job, pool)  # one worker runs cfg.max_concurrent_activities at once
    check_store(settings)
    scaler = Autoscaler(cfg=cfg, procs=WorkerProcesses(settings, home(args)))

    async def scale() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await scaler.run(stop)

    print(
        f"autoscaling {pool} on {settings.temporal.address or '127.0.0.1:7233'}: "
        f"{cfg.min_workers}..{cfg.max_workers} "
        f"workers; logs in {home(args) / 'logs'}; Ctrl-C stops them",
        flush=True,
    )
    try:
        asyncio.run(scale())
    except ConnectionError as e:
        raise UserError(str(e)) from e
    return 0


def _elastic_pool(job: JobSpec, name: str) -> str:
    """`name`, when the job declares it as a reward pool (reward workers are stateless, so only they scale)."""
    from rollart.spec.pools import pools_with_role

    if name not in job.pools:
        raise UserError(f"--pool: unknown pool {name!r}; pools are {', '.join(job.pools)}")
    if job.pools[name].role != "reward":
        raise UserError(
            f"--pool: {name!r} has a fixed set of workers (`rollart worker --pool {name}`); only reward pools "
            f"autoscale: {', '.join(pools_with_role(job.pools, 'reward'))}"
        )
    return name
