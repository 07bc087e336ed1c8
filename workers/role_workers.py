"""The Temporal workers of one pool's process: what each role (`PoolSpec.role`) registers, and on which queues.

- control (`control`): the workflows (orchestration only; kept apart from engines so a
  restarting engine never stalls workflow progress)
- env (`cpu`, or a pool a job declares, e.g. `sandbox`): `reset`, `restore` on the shared queue,
  `step`/`close` on this process's own queue; `run_agent` (agent programs, served by this process's endpoint);
  and the job's Temporal-native agent workflows on `<pool>-agents` (workers/agent_worker.py)
- generation (`h20`, `h800`, or e.g. `l40s`): `generate` on one inference engine, batched continuously, on the
  pool's queue and on this process's own (`h800@<worker>`: the later turns of the trajectories it served,
  session affinity); `reward` too when the job colocates rewards with generation, and the env activities
  when a task's env declares this pool (`@env(pool="h20")`; their sessions' steps share the private queue)
- reward (`serverless`): `reward`, a bounded number at a time so that excess work shows as
  backlog for the autoscaler
- trainer (`trainer`): `train_step`, one at a time
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.worker import Worker

from rollart.activities.engines.base import Engine
from rollart.contracts.agent_workflow import agent_queue
from rollart.infra.temporal.search_attributes import try_register
from rollart.infra.temporal.worker_tuning import activity_worker_options, workflow_worker_options
from rollart.spec.pools import queue_name, session_queue
from rollart.workers import lifeline
from rollart.workers.settings import WorkerSettings

if TYPE_CHECKING:
    from rollart.activities.env import EnvActivities
    from rollart.workers.trainer_ranks import RankGroup

__all__ = ["pool_workers", "trainer_rank_group"]

log = logging.getLogger(__name__)


@contextlib.asynccontextmanager
async def pool_workers(settings: WorkerSettings, client: Client, worker_id: str) -> AsyncIterator[list[Worker]]:
    """The Temporal workers for the pool's role, for the caller to run; what they hold (env sessions, the engine,
    the trainer's ranks) is released when the context exits."""
    pool = settings.pool
    queue = queue_name(pool, settings.temporal.task_queue_prefix)
    common = {
        "identity": worker_id,
        "max_concurrent_activities": settings.max_concurrent_activities,
        **activity_worker_options(settings.temporal.workers),
    }
    if settings.role == "control":
        from rollart.activities.children import ChildActivities
        from rollart.activities.queues import QueueActivities
        from rollart.workflows import ALL_WORKFLOWS

        await _register_search_attributes(client)
        # the training workflow's stall checks read queue descriptions through this worker's client, and a run
        # that continued as new the units an earlier run started
        queues = QueueActivities(client, settings.temporal.worker_heartbeat_s)
        yield [
            Worker(
                client,
                task_queue=queue,
                workflows=ALL_WORKFLOWS,
                identity=worker_id,
                activities=[queues.describe_queues, ChildActivities(client).describe_children],
                **workflow_worker_options(settings.temporal.workers),
            )
        ]
    elif settings.role == "env":
        from rollart.activities.agent_program import AgentActivities

        envs = _env_activities(worker_id, pool, settings.temporal.task_queue_prefix)
        agents = AgentActivities(client)  # agent programs (`env: agent`), their endpoint started on first use
        try:
            workers = [
                Worker(client, task_queue=queue, activities=[*_shared_env(envs), agents.run_agent], **common),
                _session_worker(client, envs, common),
            ]
            if settings.agent_workflows:  # Temporal-native agents: the user's workflows, on the pool's agent queue
                from rollart.workers.agent_worker import agent_worker

                flows, acts = settings.agent_workflows, settings.agent_activities
                workers.append(agent_worker(client, agent_queue(queue), flows, acts, agents.endpoint, **common))
            yield workers
        finally:
            envs.shutdown()
            await agents.shutdown()
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
        ranks = trainer_rank_group(settings)
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


def _session_worker(
    client: Client, envs: EnvActivities, common: dict[str, Any], also: list[Callable[..., Any]] | None = None
) -> Worker:
    """The worker polling this process's private queue: `step`/`close` of the sessions it holds (and `also`)."""
    acts = [envs.step, envs.step_group, envs.close, *(also or [])]
    return Worker(client, task_queue=envs.queue, activities=acts, **common)


GENERATION_DRAIN = timedelta(seconds=60)
"""How long a generation worker told to stop (SIGTERM) finishes the generations it holds, on either queue."""


@contextlib.asynccontextmanager
async def _generation_workers(settings: WorkerSettings, client: Client, worker_id: str) -> AsyncIterator[list[Worker]]:
    """`generate` on the engine, plus rewards and env sessions when the job places them on this pool."""
    from rollart.activities.generate import GenerateActivities
    from rollart.infra.store.payload import open_store

    pool, prefix = settings.pool, settings.temporal.task_queue_prefix
    common = {
        "identity": worker_id,
        "max_concurrent_activities": settings.max_concurrent_activities,
        "graceful_shutdown_timeout": GENERATION_DRAIN,
        **activity_worker_options(settings.temporal.workers),
    }
    private = session_queue(worker_id, prefix, pool)  # this engine's own queue: pinned turns (session affinity)
    async with _engine(settings) as engine:
        max_waiting = settings.engine.affinity.max_waiting
        store = open_store(settings.store)
        gen = GenerateActivities(engine, store, worker_id, settings.model_dir, queue=private, max_waiting=max_waiting)
        stats = asyncio.create_task(_log_engine_throughput(engine, pool))
        engine_acts: list[Callable[..., Any]] = [gen.generate, gen.generate_batch]
        activities = list(engine_acts)
        if settings.serve_rewards:  # colocated: rewards compete with generation in this process
            from rollart.activities.reward import RewardActivities

            rewards = RewardActivities()
            activities += [rewards.reward, rewards.reward_batch]
        envs = _env_activities(worker_id, pool, prefix) if settings.serve_envs else None
        if envs is None:
            workers = [Worker(client, task_queue=private, activities=engine_acts, **common)]
        else:  # the env sessions' private queue is this same queue: one worker serves both there
            workers = [_session_worker(client, envs, common, also=engine_acts)]
        activities += [] if envs is None else _shared_env(envs)
        try:
            yield [
                Worker(client, task_queue=queue_name(pool, prefix), activities=activities, **common),
                *workers,
            ]
        finally:
            stats.cancel()
            if envs is not None:
                envs.shutdown()


def trainer_rank_group(settings: WorkerSettings) -> RankGroup:
    """This node's agent for the trainer's ranks: megatron's, or the torch backend's with fsdp (they start at such a
    job's first step)."""
    from rollart.workers.trainer_ranks import RankGroup

    nodes = settings.nodes
    return RankGroup(
        nnodes=nodes.nnodes,
        node_rank=nodes.node_rank,
        rdzv=nodes.rdzv,
        store=settings.store,
        keep_weight_versions=settings.store.keep_weight_versions,
    )


@contextlib.asynccontextmanager
async def _engine(settings: WorkerSettings) -> AsyncIterator[Engine]:
    from rollart.activities.engines.factory import create_engine
    from rollart.infra.tiny_model import ensure_tiny_model, first_use_options

    if (options := first_use_options(settings.model_dir)) is not None:
        ensure_tiny_model(settings.model_dir, **options)  # the embedded tiny models are built on first use
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
