"""`rollart store gc`: remove the stored claims of jobs whose histories Temporal no longer holds (client/claims.py)."""

from __future__ import annotations

import argparse
import asyncio

from rollart.cli.errors import UserError
from rollart.cli.show import add_reader_args
from rollart.cli.spec import load_spec

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `store` and its `gc` subcommand."""
    store = sub.add_parser("store", help="the payload store: `gc` removes claims no history refers to any more")
    store_sub = store.add_subparsers(dest="store_command", required=True, metavar="SUBCOMMAND")
    s = store_sub.add_parser(
        "gc",
        help="remove the claims (large payloads, task specs) of jobs no workflow of which remains on the server",
        description="A claim stays while any workflow of its job remains on the server (running, or closed within the "
        "namespace's retention); run this as often as you like, e.g. daily.",
    )
    s.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    add_reader_args(s)
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Sweep the store the job spec (or the flags) names; say what was kept and removed."""
    from temporalio.service import RPCError

    from rollart.client.claims import ClaimsSweep, sweep
    from rollart.infra.store.payload import open_store
    from rollart.infra.temporal.connection import connect

    job = load_spec(args.job, args)

    async def go() -> ClaimsSweep:
        client = await connect(job.temporal, job.store)
        return await sweep(client, open_store(job.store), job.store.path, dry_run=args.dry_run)

    try:
        done = asyncio.run(go())
    except (ConnectionError, RPCError) as e:
        raise UserError(f"cannot sweep the store {job.store.path}: {e}") from e
    verb = "would remove" if args.dry_run else "removed"
    print(
        f"{verb} {done.claims} claims ({done.bytes / 1e6:.1f} MB) of {len(done.removed)} jobs whose workflows are "
        f"gone; kept those of {len(done.kept)} jobs with workflows on the server ({job.store.path})"
    )
    for owner in done.removed:
        print(f"  {verb}: {owner}")
    return 0
