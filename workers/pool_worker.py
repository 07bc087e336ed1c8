"""One Temporal worker process for one pool: what it registers depends on the pool's role (`PoolSpec.role`).

- control (`control`): the workflows (orchestration only; kept apart from engines so a
  restarting engine never stalls workflow progress)
- env (`cpu`, or a pool a job declares, e.g. `sandbox`): `reset`, `restore` on the shared queue,
  `step`/`close` on this process's own queue
- generation (`h20`, `h800`, or e.g. `l40s`): `generate` on one inference engine, batched continuously (and
  `reward` too when the job colocates rewards with generation, and the env activities when a task's env
  declares this pool: `@env(pool="h20")`)
- reward (`serverless`): `reward`, a bounded number at a time so that excess work shows as
  backlog for the autoscaler
- trainer (`trainer`): `train_step`, one at a time
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.worker import Worker

from rollart.activities.engines.base import Engine
from rollart.infra.config import EngineConfig, JobSpec, StoreConfig, TemporalConfig, TrainerConfig
from rollart.infra.pools import DEFAULT_POOLS, PoolName, PoolRole, queue_name, session_queue
from rollart.infra.temporal.connection import connect
from rollart.infra.temporal.search_attributes import try_register
from rollart.infra.temporal.worker_tuning import activity_worker_options, workflow_worker_options
from rollart.infra.waiting import Backoff, tcp_reachable, unless_stopped, wait_for
from rollart.workers import lifeline

if TYPE_CHECKING:
    from rollart.activities.env import EnvActivities
    from rollart.workers.trainer_ranks import RankGroup

__all__ = ["TrainerNodes", "WorkerSettings", "run_worker", "serve"]

log = logging.getLogger(__name__)


class TrainerNodes(BaseModel):
    """Where this trainer worker sits among the trainer's nodes (torchrun-style rendezvous).

    One `rollart worker --pool trainer` runs per node; each starts `world_size / nnodes` ranks. Node 0
    polls Temporal and hosts the rendezvous store at `rdzv` (HOST:PORT, reachable from every node);
    the others follow it. One node needs none of this: its store binds a free loopback port.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    nnodes: int = Field(1, ge=1)
    node_rank: int = Field(0, ge=0)
    rdzv: str | None = Field(None, pattern=r"^[A-Za-z0-9_.\-\[\]:]+:[0-9]{1,5}$")

    @model_validator(mode="after")
    def _consistent(self) -> TrainerNodes:
        if self.node_rank >= self.nnodes:
            raise ValueError(f"--node-rank {self.node_rank} is not below --nnodes {self.nnodes}")
        if self.nnodes > 1 and self.rdzv is None:
            raise ValueError(f"{self.nnodes} nodes need --rdzv HOST:PORT: node 0's address, reachable from every node")
        return self


class WorkerSettings(BaseModel):
    """Everything one worker process needs: where Temporal and the store are, and for generation the model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pool: PoolName
    role: PoolRole
    """What the pool's workers serve (from the job's declaration; a default pool's without a job)."""
    temporal: TemporalConfig = TemporalConfig()
    store: StoreConfig = StoreConfig()
    model_dir: Path = JobSpec.model_fields["model_dir"].default
    engine: EngineConfig = EngineConfig()
    max_concurrent_activities: int = 256
    serve_rewards: bool = False
    """Generation pools: also register the reward activities (`reward_placement: colocated`)."""
    serve_envs: bool = False
    """Generation pools: also hold env sessions (a task whose env declares this pool, `@env(pool=...)`)."""
    trainer: TrainerConfig = TrainerConfig()
    """Trainer pool: the job's trainer section (the megatron backend's ranks are laid out by it)."""
    nodes: TrainerNodes = TrainerNodes()
    connect_timeout_s: float | None = Field(None, gt=0)
    """How long to wait for Temporal (and the Mooncake master) before exiting; None: as long takes."""
    ready_file: Path | None = None
    parent_pid: int | None = None
    """The local stack or autoscaler that started this worker: its death sends the worker SIGTERM (drain, exit)."""

    @model_validator(mode="before")
    @classmethod
    def _default_role(cls, data: Any) -> Any:
        """Without a job, a default pool's role (`rollart worker --pool h800`); any other pool needs its job."""
        if not isinstance(data, dict) or "role" in data or not isinstance(data.get("pool"), str):
            return data
        default = DEFAULT_POOLS.get(data["pool"])
        if default is None:
            raise ValueError(
                f"pool {data['pool']!r} is not one of the default pools ({', '.join(DEFAULT_POOLS)}): its role "
                "comes from the job that declares it (pass --job)"
            )
        return {**data, "role": default.role}

    @classmethod
    def from_job(cls, job: JobSpec, pool: str, **overrides: object) -> WorkerSettings:
        """The settings a job implies for a worker of `pool`, one of the pools it declares."""
        spec = job.pools.get(pool)
        if spec is None:
            raise ValueError(f"pool {pool!r} is not declared in job {job.name!r}; its pools: {', '.join(job.pools)}")
        base: dict[str, object] = {
            "pool": pool,
            "role": spec.role,
            "temporal": job.temporal,
            "store": job.store,
            "model_dir": job.model_dir,
            "engine": job.engine,
            "trainer": job.trainer,
        }
        if spec.role == "reward":
            base["max_concurrent_activities"] = spec.max_concurrent_activities
        if spec.role == "generation":
            base["serve_rewards"] = job.colocates_rewards(pool)
            base["serve_envs"] = job.hosts_envs(pool)
        return cls(**{**base, **overrides})


def new_worker_id(pool: str) -> str:
    """host-pid-random: unique per process, readable in the UI's worker identity column."""
    return f"{pool}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


async def serve(settings: WorkerSettings, stop: asyncio.Event) -> None:
    """Run the pool's worker(s) until `stop` is set, then drain in-flight activities and shut down."""
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
    async with _pool_workers(settings, client, worker_id) as workers:
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


@contextlib.asynccontextmanager
async def _pool_workers(settings: WorkerSettings, client: Client, worker_id: str) -> AsyncIterator[list[Worker]]:
    pool = settings.pool
    queue = queue_name(pool, settings.temporal.task_queue_prefix)
    common = {
        "identity": worker_id,
        "max_concurrent_activities": settings.max_concurrent_activities,
        **activity_worker_options(settings.temporal.workers),
    }
    if settings.role == "control":
        from rollart.activities.queues import QueueActivities
        from rollart.workflows import ALL_WORKFLOWS

        await _register_search_attributes(client)
        # the training workflow's stall checks read queue descriptions through this worker's client
        queues = QueueActivities(client, settings.temporal.worker_heartbeat_s)
        yield [
            Worker(
                client,
                task_queue=queue,
                workflows=ALL_WORKFLOWS,
                identity=worker_id,
                activities=[queues.describe_queues],
                **workflow_worker_options(settings.temporal.workers),
            )
        ]
    elif settings.role == "env":
        envs = _env_activities(worker_id, pool, settings.temporal.task_queue_prefix)
        try:
            yield [
                Worker(client, task_queue=queue, activities=_shared_env(envs), **common),
                _session_worker(client, envs, common),
            ]
        finally:
            envs.shutdown()
    elif settings.role == "generation":
        async with _generation_workers(settings, client, worker_id) as workers:
            yield workers
    elif settings.role == "reward":
        from rollart.activities.reward import RewardActivities

        rewards = RewardActivities()
        # a worker stopped by the autoscaler (SIGTERM) finishes the rewards it holds before it exits
        yield [
            Worker(
                client,
                task_queue=queue,
                activities=[rewards.reward, rewards.reward_batch],
                graceful_shutdown_timeout=timedelta(seconds=60),
                **common,
            )
        ]
    elif settings.role == "trainer":
        from rollart.activities.trainer import TrainerActivities
        from rollart.infra.store.payload import open_store

        keep = settings.store.keep_weight_versions
        ranks = _rank_group(settings)
        trainer = TrainerActivities(open_store(settings.store), keep_weight_versions=keep, ranks=ranks)
        try:
            # one step at a time: the model and optimizer are this process's (or its ranks') state
            yield [
                Worker(
                    client,
                    task_queue=queue,
                    activities=[trainer.train_step],
                    identity=worker_id,
                    max_concurrent_activities=1,
                )
            ]
        finally:
            await asyncio.to_thread(ranks.close)
    else:
        raise ValueError(f"pool {pool!r}: role {settings.role!r} has no worker")


async def _register_search_attributes(client: Client) -> None:
    """Rollout workflows upsert their outcome's search attributes (workflows/ui_summary.py): a namespace that an
    older rollart registered gets the newer ones before this worker runs a workflow. A failure only warns."""
    try:
        await asyncio.wait_for(try_register(client), 30)
    except (TimeoutError, RPCError) as e:
        log.warning("could not check rollart's search attributes on the namespace: %s", e)


def _env_activities(worker_id: str, pool: str, prefix: str) -> EnvActivities:
    """This worker's env sessions, stepped through its own queue `<prefix><pool>@<worker>` (sticky routing)."""
    from rollart.activities.env import EnvActivities

    return EnvActivities(worker_id, queue=session_queue(worker_id, prefix, pool))


def _shared_env(envs: EnvActivities) -> list[Callable[..., Any]]:
    """The env activities any env worker of the pool may take: they start (or rebuild) sessions, or keep none."""
    return [envs.reset, envs.reset_group, envs.restore, envs.prompts, envs.check]


def _session_worker(client: Client, envs: EnvActivities, common: dict[str, Any]) -> Worker:
    """The worker polling this process's private queue: `step`/`close` of the sessions it holds."""
    return Worker(client, task_queue=envs.queue, activities=[envs.step, envs.step_group, envs.close], **common)


@contextlib.asynccontextmanager
async def _generation_workers(settings: WorkerSettings, client: Client, worker_id: str) -> AsyncIterator[list[Worker]]:
    """`generate` on the engine, plus rewards and env sessions when the job places them on this pool."""
    from rollart.activities.generate import GenerateActivities
    from rollart.infra.store.payload import open_store

    pool, prefix = settings.pool, settings.temporal.task_queue_prefix
    common = {
        "identity": worker_id,
        "max_concurrent_activities": settings.max_concurrent_activities,
        **activity_worker_options(settings.temporal.workers),
    }
    async with _engine(settings) as engine:
        weights_dir = Path(tempfile.mkdtemp(prefix=f"rollart-weights-{pool}-"))
        base = settings.model_dir / "model.safetensors"
        gen = GenerateActivities(engine, open_store(settings.store), worker_id, weights_dir, base)
        stats = asyncio.create_task(_log_engine_throughput(engine, pool))
        activities: list[Callable[..., Any]] = [gen.generate, gen.generate_batch]
        if settings.serve_rewards:  # colocated: rewards compete with generation in this process
            from rollart.activities.reward import RewardActivities

            rewards = RewardActivities()
            activities += [rewards.reward, rewards.reward_batch]
        envs = _env_activities(worker_id, pool, prefix) if settings.serve_envs else None
        workers = [] if envs is None else [_session_worker(client, envs, common)]
        activities += [] if envs is None else _shared_env(envs)
        try:
            yield [
                Worker(
                    client,
                    task_queue=queue_name(pool, prefix),
                    activities=activities,
                    graceful_shutdown_timeout=timedelta(seconds=60),
                    **common,
                ),
                *workers,
            ]
        finally:
            stats.cancel()
            shutil.rmtree(weights_dir, ignore_errors=True)
            if envs is not None:
                envs.shutdown()


def _rank_group(settings: WorkerSettings) -> RankGroup:
    """This node's agent for the megatron backend's ranks (they start at a megatron job's first step)."""
    from rollart.workers.trainer_ranks import RankGroup

    nodes = settings.nodes
    return RankGroup(
        nnodes=nodes.nnodes,
        node_rank=nodes.node_rank,
        rdzv=nodes.rdzv,
        store=settings.store,
        keep_weight_versions=settings.store.keep_weight_versions,
    )


def _check_trainer_device(trainer: TrainerConfig) -> None:
    """A trainer worker asked for CUDA on a machine without a GPU stops at once, saying so."""
    if trainer.device == "cuda":
        from rollart.activities.training.devices import resolve_device

        resolve_device("cuda")


async def _follow_trainer_node0(settings: WorkerSettings, stop: asyncio.Event) -> None:
    """Trainer nodes 1..N-1: no Temporal worker; run this node's ranks of what node 0 launches until stopped."""
    group = await asyncio.to_thread(_rank_group, settings)
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


@contextlib.asynccontextmanager
async def _engine(settings: WorkerSettings) -> AsyncIterator[Engine]:
    from rollart.activities.engines.factory import create_engine
    from rollart.infra.tiny_model import ensure_tiny_model

    if settings.model_dir == WorkerSettings.model_fields["model_dir"].default:
        ensure_tiny_model(settings.model_dir)  # the embedded default is built on first use
    _reclaim_leftover_engines(settings.pool, settings.model_dir)
    lifeline.children_die_with_me()  # the EngineCore child dies with this process, even a SIGKILLed one
    if settings.engine.kind == "vllm" and (problem := lifeline.plugin_problem()):
        log.warning("%s: a spawned vLLM engine would outlive this worker if it were killed", problem)
    lifeline.mark_engine_children(settings.pool, settings.model_dir)
    engine = create_engine(settings.model_dir, settings.engine)
    log.info("starting %s engine on %s", settings.engine.kind, settings.model_dir)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.shutdown()


def _reclaim_leftover_engines(pool: str, model_dir: Path) -> None:
    """Report engine processes a dead worker of this pool left behind; end those on this model dir (ours to end)."""
    leftovers = lifeline.leftover_engines(pool)
    if not leftovers:
        return
    killed = {left.pid for left in lifeline.reclaim(leftovers, model_dir)}
    for left in leftovers:
        what = "killed it" if left.pid in killed else f"left running (model dir {left.model_dir})"
        log.warning(
            "leftover %s engine of dead worker pid %d: pid %d, %.0f MiB resident: %s",
            left.pool,
            left.worker_pid,
            left.pid,
            left.rss_mib,
            what,
        )


async def _log_engine_throughput(engine: Engine, pool: str, every_s: float = 30.0) -> None:
    """A log line per interval with tokens generated and tokens/s, only when the engine did something."""
    last, t_last = engine.tokens_generated(), time.monotonic()
    while True:
        await asyncio.sleep(every_s)
        now, t_now = engine.tokens_generated(), time.monotonic()
        if now != last:
            log.info(
                "%s engine: %d tokens in the last %.0fs (%.0f tokens/s), %d in total",
                pool,
                now - last,
                t_now - t_last,
                (now - last) / (t_now - t_last),
                now,
            )
        last, t_last = now, t_now


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
