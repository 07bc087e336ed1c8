"""Rollouts without Temporal: the rollout driver over the activity code, called in this process.

`rollart eval` plays held-out episodes this way, and the overhead bench's plain asyncio loop measures
Temporal against it: the same driver, the same activity code, the same units as `rollart rollout` —
only no server, queues, histories or processes in between.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import tempfile
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from rollart.activities.engines.base import Engine
from rollart.activities.engines.factory import create_engine
from rollart.activities.env import EnvActivities
from rollart.activities.generate import GenerateActivities
from rollart.activities.reward import RewardActivities
from rollart.client.rollout import unit_input
from rollart.contracts.activities import ActivityName
from rollart.contracts.generation import LiveEnginesInput, LiveEnginesResult
from rollart.contracts.rollouts import TrajectoryInput, TrajectoryResult
from rollart.infra.store.payload import open_store
from rollart.spec.config import EngineConfig, StoreConfig
from rollart.workflows.driver.calls import CallFailed
from rollart.workflows.driver.episode import Episode
from rollart.workflows.driver.grouped import play_groups
from rollart.workflows.driver.lockstep import play

__all__ = ["InProcessCalls", "in_process_activities", "play_unit", "started_engine"]

log = logging.getLogger("rollart.in_process")


class InProcessCalls:
    """`Calls` without Temporal: each call runs an activity method of this process, in an activity context of
    its own; an error it raises becomes `CallFailed` as Temporal would report it (no retries here)."""

    logger = log

    def __init__(self, handlers: dict[str, Callable[[Any], Awaitable[Any]]]) -> None:
        self._handlers = {ActivityName.LIVE_ENGINES.value: _one_engine, **handlers}
        self.counts: Counter[str] = Counter()  # calls made, by activity name

    @classmethod
    def of(cls, *objects: object) -> InProcessCalls:
        """The activity methods of `objects`, by activity name (each is named for its activity)."""
        handlers = {a.value: getattr(o, a.value) for a in ActivityName for o in objects if hasattr(o, a.value)}
        return cls(handlers)

    async def call(
        self,
        activity: ActivityName,
        arg: BaseModel,
        *,
        queue: str,
        result_type: Any = None,
        timeout_s: float | None = None,
        start_wait_s: float | None = None,
        heartbeat_s: float | None = None,
    ) -> Any:
        env = ActivityEnvironment()  # a unique activity id: vLLM request ids are derived from it
        env.info = dataclasses.replace(
            env.info,
            activity_id=uuid.uuid4().hex,
            activity_type=activity.value,
            task_queue=queue,
            workflow_id="in-process",
        )
        self.counts[activity.value] += 1
        try:
            return await env.run(self._handlers[activity.value], arg)
        except ApplicationError as e:
            raise CallFailed(
                activity.value, f"{e.type}: {e.message}" if e.type else e.message, error_type=e.type
            ) from e
        except Exception as e:  # what Temporal would report once retries ran out: the exception's type and text
            raise CallFailed(activity.value, f"{type(e).__name__}: {e}", error_type=type(e).__name__) from e


async def _one_engine(inp: LiveEnginesInput) -> LiveEnginesResult:
    """`live_engines` in one process: its one engine has no queue of its own, so a wave goes to it whole."""
    return LiveEnginesResult()


@contextlib.asynccontextmanager
async def started_engine(model_dir: Path, config: EngineConfig) -> AsyncIterator[Engine]:
    """The inference engine a generation worker would run (vLLM, or the HF fallback), started in this process."""
    engine = create_engine(model_dir, config)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.shutdown()


@contextlib.asynccontextmanager
async def in_process_activities(
    engine: Engine, model_dir: Path, store: StoreConfig | None = None, env_threads: int = 64
) -> AsyncIterator[InProcessCalls]:
    """Env, generation (on `engine`) and reward activities in this process, as `InProcessCalls`.

    Turn records go to `store` (default: a temporary local store, removed afterwards).
    """
    scratch = Path(tempfile.mkdtemp(prefix="rollart-in-process-"))
    envs = EnvActivities("in-process", queue="in-process", env_threads=env_threads)
    try:
        gen = GenerateActivities(
            engine, open_store(store or StoreConfig(path=scratch / "store")), "in-process", model_dir
        )
        yield InProcessCalls.of(envs, gen, RewardActivities())
    finally:
        envs.shutdown()
        shutil.rmtree(scratch, ignore_errors=True)


async def play_unit(
    calls: InProcessCalls, first: int, members: list[TrajectoryInput], job_id: str
) -> list[TrajectoryResult]:
    """Play one unit of `rollout_units` in this process, as the workflow `rollart rollout` starts for it would
    (a single-turn group as a wave of one, a `rollout_unit: group` group in one session, else an episode)."""
    _, unit_id, inp = unit_input(first, members, job_id)
    if isinstance(inp, TrajectoryInput):
        return await play([Episode(calls, inp, unit_id)])
    return await play_groups(calls, inp, None)
