"""Local stack or remote server: where `rollart rollout` and `train` run their workflows.

A job that names a Temporal server (`temporal.address`, or `--temporal-address`) runs there; otherwise
the command starts a local stack (dev server + one worker process per pool the job needs) and stops
it when done.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rollart.cli.errors import UserError
from rollart.cli.model import ensure_model

if TYPE_CHECKING:
    from temporalio.client import Client

    from rollart.spec.config import JobSpec

__all__ = [
    "CONNECT_WAIT_S",
    "Server",
    "add_stack_args",
    "connect_client",
    "home",
    "prepare_local_stack",
    "server_for",
    "stack_pools",
]


@dataclass(frozen=True)
class Server:
    """Where a command's workflows run: the job pointed at it, the UI base URL for links, and whether it is ours."""

    job: JobSpec
    ui: str
    local: bool


def add_stack_args(s: argparse.ArgumentParser) -> None:
    """--home, --port and --ui-port, for commands that may start the local stack."""
    s.add_argument(
        "--home", type=Path, help="where the local stack keeps its database, logs and store (default .rollart)"
    )
    s.add_argument("--port", type=int, default=7233, help="local Temporal gRPC port (default 7233)")
    s.add_argument("--ui-port", type=int, default=8233, help="local Temporal UI port (default 8233)")
    s.add_argument(
        "--control-processes",
        type=_positive,
        default=1,
        metavar="N",
        help="control worker processes of the local stack, all on the control queue (default 1; more help "
        "only when the control worker, not the server, is saturated: docs/benchmarks.md, scale)",
    )


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return n


def stack_pools(pools: list[str], args: argparse.Namespace) -> list[str]:
    """The worker processes to start: `pools`, with --control-processes control workers where it has one."""
    from rollart.spec.pools import Pool

    extra = [Pool.CONTROL.value] * (args.control_processes - 1) if Pool.CONTROL in pools else []
    return [*pools, *extra]


def home(args: argparse.Namespace) -> Path:
    """The local stack's directory: --home, else `.rollart`."""
    from rollart.spec.config import DEFAULT_HOME

    return args.home or DEFAULT_HOME


@contextmanager
def server_for(job: JobSpec, args: argparse.Namespace, *, training: bool) -> Iterator[Server]:
    """The job's own server when it names one; else a local stack with the pools the job needs, stopped on exit."""
    if job.temporal.address:
        yield Server(job, args.ui_url or f"http://{job.temporal.address.rsplit(':', 1)[0]}:8233", local=False)
        return
    from rollart.workers.local_stack import LocalStack, pools_for_job

    if job.temporal.secured:  # the dev server has no TLS: a secured job without an address forgot it
        fields = " and ".join(
            f
            for f, v in (
                ("temporal.tls", job.temporal.tls),
                ("temporal.api_key_env", job.temporal.api_key_env),
                ("temporal.api_key_file", job.temporal.api_key_file),
            )
            if v is not None
        )
        raise UserError(
            f"{args.job}: {fields} {'are' if ' and ' in fields else 'is'} set but no server is named: "
            "set temporal.address (or pass --temporal-address); without one rollart starts a local dev "
            "server, which has no TLS"
        )
    prepare_local_stack(job, str(args.job))
    stack = LocalStack(
        job=job,
        pools=stack_pools(pools_for_job(job, training=training), args),
        home=home(args),
        port=args.port,
        ui_port=args.ui_port,
    )
    print(f"starting the local stack (Temporal on {stack.address}, workers: {', '.join(stack.pools)}) ...")
    with stack:
        local_job = job.model_copy(update={"temporal": stack.temporal, "store": stack.store})
        yield Server(local_job, args.ui_url or stack.ui_url or "", local=True)
        print(f"history kept in {stack.home / 'temporal.db'}; `rollart up` serves it again in the UI")


def prepare_local_stack(job: JobSpec, source: str) -> None:
    """Before this machine's workers start: the devices the job asks for exist, and its model is there."""
    if job.trainer.device == "cuda":
        from rollart.activities.training.devices import DeviceUnavailable, resolve_device

        try:
            resolve_device("cuda")
        except DeviceUnavailable as e:
            raise UserError(f"the job's trainer cannot run on this machine: {e}") from e
    ensure_model(job, source)


CONNECT_WAIT_S = 60.0
"""How long `rollart train` and `rollart rollout` wait for a server that is down (or restarting) when they start."""


async def connect_client(job: JobSpec, wait_s: float = CONNECT_WAIT_S) -> Client:
    """A client of the job's Temporal server, waited for up to `wait_s` ("Temporal unreachable, retrying");
    a server still unreachable then, or an address that cannot be one, is a UserError."""
    from rollart.client.connection import Outage, connect_retrying

    outage = Outage()
    try:
        return await connect_retrying(job.temporal, job.store, outage, give_up_after_s=wait_s)
    except ConnectionError as e:
        waited = f" (waited {wait_s:.0f} s)" if outage.down else ""
        raise UserError(f"{e}{waited}") from e
