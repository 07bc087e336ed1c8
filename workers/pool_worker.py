"""One worker process for one pool: wait for Temporal (and the store), run the role's workers until told to stop, drain.

`serve` is the process's lifetime (what it registers is `role_workers.pool_workers`); `run_worker` is the blocking
entry point `rollart worker` calls, stopping on SIGINT/SIGTERM. Trainer nodes after the first run no Temporal worker:
they follow node 0's ranks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import uuid

from temporalio.client import Client

from rollart.infra.secrets import remember_file
from rollart.infra.temporal.connection import connect
from rollart.infra.waiting import Backoff, tcp_reachable, unless_stopped, wait_for
from rollart.spec.config import StoreConfig, TrainerConfig
from rollart.workers import lifeline
from rollart.workers.role_workers import pool_workers, trainer_rank_group
from rollart.workers.settings import WorkerSettings

__all__ = ["run_worker", "serve"]

log = logging.getLogger(__name__)


def new_worker_id(pool: str) -> str:
    """host-pid-random: unique per process, readable in the UI's worker identity column."""
    return f"{pool}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


async def serve(settings: WorkerSettings, stop: asyncio.Event) -> None:
    """Run the pool's worker(s) until `stop` is set, then drain in-flight activities and shut down."""
    if settings.temporal.tls is not None and settings.temporal.tls.key is not None:
        remember_file(settings.temporal.tls.key)  # scrubbed from what its envs and programs print (infra/secrets.py)
    if settings.role == "trainer":
        _check_trainer_device(settings.trainer)
        if settings.nodes.node_rank > 0:
            await _follow_trainer_node0(settings, stop)
            return
    client = await unless_stopped(_dependencies(settings), stop)
    if client is None:
        log.info("stopped while waiting for Temporal at %s", settings.temporal.address)
        return
    worker_id = new_worker_id(settings.pool)
    async with pool_workers(settings, client, worker_id) as workers:
        async with contextlib.AsyncExitStack() as stack:
            for w in workers:
                await stack.enter_async_context(w)
            queues = ", ".join(w.task_queue for w in workers)
            log.info(
                "worker %s ready: pool=%s queues=[%s] server=%s",
                worker_id,
                settings.pool,
                queues,
                settings.temporal.address,
            )
            if settings.ready_file:
                settings.ready_file.parent.mkdir(parents=True, exist_ok=True)
                settings.ready_file.write_text(worker_id)
            await stop.wait()
            log.info("worker %s draining", worker_id)
    log.info("worker %s stopped", worker_id)


async def _dependencies(settings: WorkerSettings) -> Client:
    """Wait for the Mooncake master (if the store is Mooncake), then for Temporal; a client once both answer."""
    backoff = Backoff(timeout_s=settings.connect_timeout_s)
    await _wait_for_store(settings.store, backoff)
    return await connect(settings.temporal, settings.store, wait=backoff)


async def _wait_for_store(store: StoreConfig, backoff: Backoff) -> None:
    """A Mooncake store's master must answer before the store opens (its client would give up after ~5 s)."""
    master = store.mooncake.master if store.kind == "mooncake" else None
    if not master:
        return
    host, _, port = master.rpartition(":")

    def transient(e: BaseException) -> str | None:
        if isinstance(e, socket.gaierror):  # a host that does not resolve is a typo, not a master still starting
            return None
        return f"{type(e).__name__}: {e}" if isinstance(e, OSError | asyncio.TimeoutError) else None

    await wait_for(
        f"the Mooncake master at {master}", lambda: tcp_reachable(host.strip("[]"), int(port)), transient, backoff
    )


def _check_trainer_device(trainer: TrainerConfig) -> None:
    """A trainer worker asked for CUDA on a machine without a GPU stops at once, saying so."""
    if trainer.device == "cuda":
        from rollart.activities.training.devices import resolve_device

        resolve_device("cuda")


async def _follow_trainer_node0(settings: WorkerSettings, stop: asyncio.Event) -> None:
    """Trainer nodes 1..N-1: no Temporal worker; run this node's ranks of what node 0 launches until stopped."""
    group = await asyncio.to_thread(trainer_rank_group, settings)
    log.info(
        "trainer node %d of %d following node 0 at %s",
        settings.nodes.node_rank,
        settings.nodes.nnodes,
        settings.nodes.rdzv,
    )
    if settings.ready_file:
        settings.ready_file.parent.mkdir(parents=True, exist_ok=True)
        settings.ready_file.write_text(f"trainer-node-{settings.nodes.node_rank}")
    follower = asyncio.create_task(asyncio.to_thread(group.follow))
    await stop.wait()
    group.close()
    await follower


def run_worker(settings: WorkerSettings) -> int:
    """Blocking entry point: serve until SIGINT/SIGTERM, then drain. Returns the exit code."""

    if settings.parent_pid is not None:  # started by a local stack or autoscaler: drain and exit when it dies
        lifeline.die_with_parent(settings.parent_pid, signal.SIGTERM)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve(settings, stop)

    asyncio.run(main())
    return 0
