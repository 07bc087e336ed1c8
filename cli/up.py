"""`rollart up`: the local Temporal dev server and one worker process per pool, until Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from rollart.cli.errors import UserError
from rollart.cli.spec import load_spec
from rollart.cli.stack import add_stack_args, home, prepare_local_stack, stack_pools

if TYPE_CHECKING:
    from rollart.spec.config import JobSpec

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `up` and its flags."""
    s = sub.add_parser("up", help="start the local Temporal dev server and one worker per pool; Ctrl-C stops all")
    s.add_argument(
        "--job", type=Path, help="job spec for the workers' settings (default: examples/frozenlake.yaml's defaults)"
    )
    s.add_argument(
        "--pools",
        help="comma-separated pools to start (default: every pool the job declares: control, cpu, h800, h20, "
        "serverless, trainer and the job's own)",
    )
    add_stack_args(s)
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Start the stack, print where everything is, wait for Ctrl-C/SIGTERM, then drain and stop it all."""
    from rollart.workers.local_stack import LocalStack

    job = load_spec(args.job, args)
    pools = _pools(job, args.pools)
    prepare_local_stack(job, str(args.job or "the default job"))
    _warn_unserved(job, pools)
    stack = LocalStack(job=job, pools=stack_pools(pools, args), home=home(args), port=args.port, ui_port=args.ui_port)
    stop = _stop_on_signals()
    print(f"starting Temporal on {stack.address} and workers for: {', '.join(pools)} ...")
    with stack:
        print(f"ready. Temporal UI: {stack.ui_url}   server: {stack.address}   logs: {stack.home / 'logs'}")
        if stack.mooncake:
            master = stack.mooncake.address
            print(f"Mooncake master: {master} (workers on other machines: --store-master {master})")
        for name, pid in stack.worker_pids().items():
            print(f"  worker {name:<14} pid {pid}")
        for server in job.env_servers:  # restarted by the stack if it dies
            pid = stack.env_servers.pids().get(server.name) if stack.env_servers else None
            print(f"  env server {server.name:<10} pid {pid}  {server.base_url} (OpenEnv: {server.env})")
        print("Ctrl-C stops everything.")
        stop.wait()
        print("stopping workers (draining in-flight work) and the server ...")
    print("stopped.")
    return 0


def _pools(job: JobSpec, names: str | None) -> list[str]:
    """The pools --pools names (each one the job declares), or all of them."""
    if not names:
        return list(job.pools)
    pools = [p.strip() for p in names.split(",")]
    unknown = [p for p in pools if p not in job.pools]
    if unknown:
        raise UserError(f"--pools: unknown pool {', '.join(map(repr, unknown))}; pools are {', '.join(job.pools)}")
    return pools


def _warn_unserved(job: JobSpec, pools: list[str]) -> None:
    """Work the job routes to a pool that --pools leaves out would wait forever: say so before it does."""
    started = set(pools)
    for what, queues in (("envs", {t.env_queue for t in job.tasks}), ("rewards", {t.reward_queue for t in job.tasks})):
        unserved = sorted(queues - started)
        if unserved:
            print(
                f"warning: the job's {what} run on {', '.join(unserved)}, which --pools does not start here; "
                "run those workers elsewhere (or `rollart autoscale`), or they will wait",
                file=sys.stderr,
            )


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop
