"""`rollart worker`: one Temporal worker process for one pool (one per pool per machine)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rollart.cli.errors import UserError
from rollart.cli.spec import add_temporal_args, override, read_spec

if TYPE_CHECKING:
    from rollart.spec.config import JobSpec
    from rollart.workers.settings import TrainerNodes, WorkerSettings

__all__ = ["add_parser", "check_store", "run", "worker_settings"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `worker` and its flags (the trainer-node flags in their own group)."""
    from rollart.spec.pools import DEFAULT_POOLS

    s = sub.add_parser("worker", help="run one Temporal worker for one pool (one per pool per machine)")
    s.add_argument(
        "--pool",
        help=f"the pool to serve: {', '.join(DEFAULT_POOLS)}, or one the job (--job) declares under `pools:`",
    )
    s.add_argument("--job", type=Path, help="job spec to take the model, engine, store and Temporal settings from")
    add_temporal_args(s)
    s.add_argument("--model-dir", type=Path, help="model for generation pools (default: the job's, or the tiny model)")
    s.add_argument("--engine", choices=["vllm", "hf"], help="inference engine for generation pools (default vllm)")
    s.add_argument("--store-path", type=Path, help="payload store directory (must be shared with every worker)")
    s.add_argument(
        "--store-master",
        metavar="HOST:PORT",
        help="Mooncake master to use (sets store.kind: mooncake; its keeper holds the data)",
    )
    s.add_argument(
        "--connect-timeout",
        type=float,
        metavar="SECONDS",
        help="give up (exit 1) if Temporal, or the job's Mooncake master, is still unreachable after this "
        "long (default: wait as long takes, retrying with backoff up to every 10 s)",
    )
    t = s.add_argument_group(
        "trainer nodes",
        "a multi-node trainer: one `rollart worker --pool trainer` per node "
        "(torchrun-style); each starts its share of the job's trainer.parallel ranks",
    )
    t.add_argument("--nnodes", type=int, default=1, help="trainer nodes in all (default 1)")
    t.add_argument("--node-rank", type=int, default=0, help="this node's index, 0..NNODES-1; node 0 polls Temporal")
    t.add_argument(
        "--rdzv",
        metavar="HOST:PORT",
        help="node 0's rendezvous address, reachable from every node (node 0 listens there)",
    )
    s.add_argument("--settings-file", type=Path, help=argparse.SUPPRESS)
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Serve the pool until SIGTERM/Ctrl-C, then drain; settings come from --settings-file (the local stack's)
    or from the job and flags."""
    from rollart.workers.pool_worker import run_worker
    from rollart.workers.settings import WorkerSettings

    if args.settings_file:
        settings = WorkerSettings.model_validate_json(args.settings_file.read_text())
    else:
        if not args.pool:
            from rollart.spec.pools import DEFAULT_POOLS

            raise UserError(f"--pool is required ({', '.join(DEFAULT_POOLS)}, or a pool the job declares)")
        settings = worker_settings(args, read_spec(args.job) if args.job else None)
    from rollart.activities.training.devices import DeviceUnavailable
    from rollart.infra.temporal.connection import (
        NamespaceNotFound,
        TemporalAddressError,
        TemporalSecurityError,
    )
    from rollart.infra.waiting import DependencyTimeout

    try:
        return run_worker(settings)
    except DeviceUnavailable as e:
        raise UserError(f"the {settings.pool} worker cannot run on this machine: {e}") from e
    except (NamespaceNotFound, TemporalAddressError, TemporalSecurityError) as e:
        raise UserError(str(e)) from e
    except DependencyTimeout as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def worker_settings(args: argparse.Namespace, job: JobSpec | None) -> WorkerSettings:
    """This worker's settings: the job's for its pool (the defaults without a job) with the flags laid over them."""
    from rollart.cli.model import check_model_dir
    from rollart.spec.pools import DEFAULT_POOLS
    from rollart.workers.settings import WorkerSettings

    pool = args.pool
    if job is not None:
        if pool not in job.pools:
            raise UserError(f"--pool: {args.job} declares no pool {pool!r}; its pools: {', '.join(job.pools)}")
        settings = WorkerSettings.from_job(override(job, args, str(args.job)), pool)
    elif pool in DEFAULT_POOLS:
        settings = override(WorkerSettings(pool=pool), args, None)
    else:
        raise UserError(
            f"--pool: {pool!r} is not one of the default pools ({', '.join(DEFAULT_POOLS)}): pass --job with the "
            "job spec that declares it (its role says what the worker serves)"
        )
    check_store(settings)
    if settings.role == "generation":
        check_model_dir(settings.model_dir, "--model-dir" if args.model_dir else str(args.job))
    if args.connect_timeout is not None:
        if args.connect_timeout <= 0:
            raise UserError(f"--connect-timeout must be positive, got {args.connect_timeout:g}")
        settings = settings.model_copy(update={"connect_timeout_s": args.connect_timeout})
    if args.nnodes != 1 or args.node_rank or args.rdzv:
        settings = settings.model_copy(update={"nodes": _trainer_nodes(args, settings, job)})
    return settings


def check_store(settings: WorkerSettings) -> None:
    """A worker outside the local stack must be told where the Mooncake master is."""
    if settings.store.kind == "mooncake" and not settings.store.mooncake.master:
        raise UserError(
            "the job's store is Mooncake but no master is given: pass --store-master HOST:PORT "
            "(the address `rollart up` prints, or your cluster's mooncake_master)"
        )


def _trainer_nodes(args: argparse.Namespace, settings: WorkerSettings, job: JobSpec | None) -> TrainerNodes:
    from pydantic import ValidationError

    from rollart.workers.settings import TrainerNodes

    if settings.role != "trainer":
        raise UserError("--nnodes/--node-rank/--rdzv are for --pool trainer only")
    try:
        nodes = TrainerNodes(nnodes=args.nnodes, node_rank=args.node_rank, rdzv=args.rdzv)
    except ValidationError as e:
        raise UserError("; ".join(err["msg"].removeprefix("Value error, ") for err in e.errors())) from e
    trainer = settings.trainer
    if job is not None and trainer.ranks % args.nnodes:
        layout = (
            f"trainer.fsdp ranks {trainer.fsdp.ranks}"
            if trainer.fsdp is not None
            else f"trainer.parallel tensor {trainer.parallel.tensor} x data {trainer.parallel.data}"
        )
        raise UserError(f"{args.job}: {layout} = {trainer.ranks} ranks do not split over --nnodes {args.nnodes}")
    return nodes
