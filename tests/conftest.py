"""Shared fixtures and the test tiers.

Tiers (markers, registered in pyproject.toml), each with its own timeout per test:
  unit           no server, no subprocess (the default for an unmarked test; a guard fails one that spawns)
  orchestration  a Temporal dev server and stand-in activities (why not the time-skipping server: bare_env)
  integration    real processes: the local stack (dev server, worker processes, vLLM), Mooncake, the CLI
  chaos          kills processes and restarts the server mid-training (also integration)

The stack is what `rollart up` runs: a Temporal dev server (SQLite, free ports)
and one worker process per pool, generation on a real vLLM engine.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from rollart.infra.local.devserver import dynamic_config_args, find_temporal_cli, free_port
from rollart.infra.temporal.connection import connect, data_converter, runtime
from rollart.spec.config import EngineConfig, JobSpec, StoreConfig, TemporalConfig
from rollart.spec.pools import Pool
from rollart.workers.local_stack import LocalStack
from tests.support.spawn_guard import no_spawning
from tests.support.tasks import frozenlake_task

TIERS = ("unit", "orchestration", "integration", "chaos")  # cheapest first

# Seconds per test (setup, call and teardown), by tier. Measured on the shared 2-core machine, the slowest unit
# test takes 3 s and the slowest orchestration test 10 s (the schedule-to-start failover); an integration test
# may first wait up to 300 s for the stack, and a chaos run trains a whole job around its kill (about a minute).
# A test may still set its own with @pytest.mark.timeout.
TIMEOUT_S = {"unit": 60, "orchestration": 120, "integration": 900, "chaos": 1200}


def tier(item: pytest.Item) -> str:
    """The tier of a test: its most demanding tier marker, `unit` when it has none."""
    return next((t for t in reversed(TIERS[1:]) if item.get_closest_marker(t)), "unit")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: unmarked tests must already carry `unit`
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give every test its tier's marker and timeout, and run the tiers cheapest first."""
    # Tier by tier, cheapest first (stable: file order within a tier): a failing unit test shows at once,
    # and no server or stack of a later tier is up yet while the spawn guard watches the unit tests.
    items.sort(key=lambda item: TIERS.index(tier(item)))
    for item in items:
        t = tier(item)
        if t == "unit":
            item.add_marker(pytest.mark.unit)
        if t == "chaos" and not item.get_closest_marker("integration"):
            item.add_marker(pytest.mark.integration)
        if not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(TIMEOUT_S[t]))


def _guarded(item: pytest.Item) -> Generator[None, None, None]:
    """Run a test phase; for a unit test under the spawn guard, failing it if it tried to start anything."""
    if tier(item) != "unit":
        return (yield)
    with no_spawning() as attempts:
        try:
            return (yield)
        finally:
            if attempts:  # also when the code under test caught the SpawnInUnitTest it raised
                pytest.fail(
                    f"unit test {item.nodeid} tried to start a process or server ({', '.join(attempts)}): "
                    "mark it orchestration or integration",
                    pytrace=False,
                )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    """Fixtures count: a unit test must not reach a server fixture either."""
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """The test body, under the guard when it is a unit test."""
    return (yield from _guarded(item))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rollart.infra.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a chat template in Qwen's tool format (`rollart init-model --chat`)."""
    from rollart.infra.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny-chat", chat=True)


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


class _SessionStack:
    """The one local stack the integration tier shares, stopped where the chaos tier begins.

    Chaos tests start stacks of their own and kill parts of them; an idle session stack (its vLLM engine
    above all) would share the two cores with them, so it goes before the first chaos test runs.
    """

    def __init__(self) -> None:
        self.stack: LocalStack | None = None
        self.stopped = False

    def start(self, job: JobSpec) -> LocalStack:
        if self.stopped:
            raise RuntimeError("the session stack is stopped once the chaos tier begins: start a stack of your own")
        self.stack = LocalStack(
            job=job,
            pools=[Pool.CONTROL, Pool.CPU, Pool.H800, Pool.SERVERLESS, Pool.TRAINER],
            home=job.store.path.parent,
            port=free_port(),
            ui_port=free_port(),
        )
        self.stack.start(timeout_s=300)
        return self.stack

    def stop(self) -> None:
        self.stopped = True
        if self.stack is not None:
            self.stack.stop()
            self.stack = None


_session_stack = _SessionStack()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """The session stack goes once the last test before the chaos tier is done (tiers run in order)."""
    if nextitem is not None and tier(nextitem) == "chaos" and tier(item) != "chaos":
        _session_stack.stop()


@pytest.fixture(scope="session")
def stack(stack_job: JobSpec) -> Iterator[LocalStack]:
    """A real local stack: dev server + control, cpu, h800 (vLLM), serverless and trainer worker processes."""
    yield _session_stack.start(stack_job)
    _session_stack.stop()


@pytest.fixture(scope="session")
async def client(stack: LocalStack, stack_job: JobSpec) -> AsyncIterator[Client]:
    yield await connect(stack.temporal, stack_job.store)


@pytest.fixture(scope="session")
async def bare_env(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[WorkflowEnvironment]:
    """A real dev server with no rollart workers: for orchestration tests, with stand-in activities.

    Not the time-skipping test server (`WorkflowEnvironment.start_time_skipping`): it never starts a child
    workflow that carries custom search attributes, so TrainingWorkflow's rollouts hang there, and it does not
    implement the operator service `ensure_registered` calls. Nor would it save time: no workflow here waits on
    a timer, and time is not skipped while an activity task is outstanding, so a schedule-to-start timeout
    (test_failover_workflow) takes its 10 s there too, as it does with the dev server's time skipping (V2).
    """
    store = StoreConfig(path=tmp_path_factory.mktemp("bare") / "store")
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=find_temporal_cli(),
        dev_server_extra_args=dynamic_config_args(),  # as every server rollart starts (infra/local/devserver.py)
        data_converter=data_converter(store),
        ui=False,
        runtime=runtime(TemporalConfig().worker_heartbeat_s),  # stand-in workers heartbeat as real ones do
    )
    yield env
    await env.shutdown()


@pytest.fixture(autouse=True)
async def _no_workflow_outlives_its_test(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """Workflows a test left running on the shared dev server (a stalled job checks its queues every second,
    forever) are terminated when it ends: each test finds the server idle, whatever ran before it."""
    yield
    if "bare_env" not in request.fixturenames:
        return
    env: WorkflowEnvironment = request.getfixturevalue("bare_env")
    async for wf in env.client.list_workflows('ExecutionStatus = "Running"'):
        try:
            await env.client.get_workflow_handle(wf.id, run_id=wf.run_id).terminate(reason="its test ended")
        except RPCError:
            pass  # it ended meanwhile


@pytest.fixture
def queue_prefix() -> str:
    """A task queue prefix of this test's own, so no worker of another test can take its tasks."""
    return f"t{uuid.uuid4().hex[:8]}-"
