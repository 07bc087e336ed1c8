"""Shared fixtures: the tiny model, and for integration tests one real local stack per session.

The stack is what `rollart up` runs: a Temporal dev server (SQLite, free ports)
and one worker process per pool, generation on a real vLLM engine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from rollart.infra.config import EngineConfig, JobSpec, StoreConfig
from rollart.infra.devserver import find_temporal_cli, free_port
from rollart.infra.pools import Pool
from rollart.infra.temporal import connect, data_converter
from rollart.workers.local_stack import LocalStack
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from tests.support.tasks import frozenlake_task


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rollart.infra.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture(scope="session")
def stack_job(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> JobSpec:
    home = tmp_path_factory.mktemp("stack")
    return JobSpec(
        name="itest",
        model_dir=tiny_model,
        tasks=[frozenlake_task()],
        engine=EngineConfig(kind="vllm", max_model_len=256),
        store=StoreConfig(path=home / "store"),
    )


@pytest.fixture(scope="session")
def stack(stack_job: JobSpec) -> Iterator[LocalStack]:
    """A real local stack: dev server + control, cpu, h800 (vLLM), serverless and trainer worker processes."""
    home = stack_job.store.path.parent
    s = LocalStack(
        job=stack_job,
        pools=[Pool.CONTROL, Pool.CPU, Pool.H800, Pool.SERVERLESS, Pool.TRAINER],
        home=home,
        port=free_port(),
        ui_port=free_port(),
    )
    s.start(timeout_s=300)
    yield s
    s.stop()


@pytest.fixture(scope="session")
async def client(stack: LocalStack, stack_job: JobSpec) -> AsyncIterator[Client]:
    yield await connect(stack.temporal, stack_job.store)


@pytest.fixture(scope="session")
async def bare_env(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[WorkflowEnvironment]:
    """A real dev server with no rollart workers: for orchestration tests with stand-in activities."""
    store = StoreConfig(path=tmp_path_factory.mktemp("bare") / "store")
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=find_temporal_cli(),
        data_converter=data_converter(store),
        ui=False,
    )
    yield env
    await env.shutdown()
