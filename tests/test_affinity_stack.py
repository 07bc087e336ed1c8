"""Two real vLLM generation workers on one pool (the chaos tier: they share one stack): session affinity read from the
workflows' histories, and one of them SIGKILLed mid-training with nothing lost.

Which worker ran each activity, on which queue, is in each trajectory's history (`activity_spans`): a
trajectory's first turn goes to the pool's shared queue, its later turns to the private queue of the worker
that served the first, and that worker runs them.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.client import Client

from rollart.client.rollout import plan_trajectories, run_rollout
from rollart.client.train import start_training
from rollart.contracts.training import TrainingResult, TrainingStatus
from rollart.infra.local.devserver import free_port
from rollart.infra.temporal.connection import connect
from rollart.infra.temporal.history import activity_spans
from rollart.spec.config import AffinityConfig, EngineConfig, JobSpec, StoreConfig, TrainingConfig
from rollart.spec.pools import Pool
from rollart.workers.local_stack import LocalStack
from tests.support.tasks import frozenlake_task

STEPS = 6
LONG_GAME = {"maps": "standard", "invalid_action": "noop"}  # no move ends nothing: episodes last their turns


def check_affinity(turns: list[tuple[str, str]], prefix: str = "") -> None:
    """(queue, worker) of one trajectory's generate calls: the first on the shared queue, the rest on the private
    queue of the worker that ran the first, run by it."""
    (queue, first), later = turns[0], turns[1:]
    assert queue == f"{prefix}h800" and first, turns
    assert later == [(f"{prefix}h800@{first}", first)] * len(later), turns


async def generate_turns(client: Client, workflow_id: str) -> list[tuple[str, str]]:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return [(s.task_queue, s.worker_identity) for s in activity_spans(history) if s.activity_type == "generate"]


@pytest.mark.integration
@pytest.mark.chaos
async def test_each_engine_serves_the_later_turns_of_its_trajectories(two_engines: LocalStack) -> None:
    """Every trajectory's later turns stay on the engine of its first, whichever of the two that was, and each
    reports that engine. In the chaos tier because it shares the two-engine stack the kill below needs (a second
    vLLM engine is the expensive part); the workflow's routing is checked without a server in
    tests/test_affinity_workflow.py."""
    stack = two_engines
    client = await connect(stack.temporal, stack.job.store)
    job = stack.job.model_copy(update={"tasks": [frozenlake_task(max_turns=4, env_args=LONG_GAME)]})
    job_id = f"aff-{uuid.uuid4().hex[:6]}"
    outcomes = await run_rollout(client, plan_trajectories(job, 12, seed=5, job_id=job_id), job_id)
    assert [o.status for o in outcomes] == ["completed"] * 12
    served = set()
    for o in outcomes:
        turns = await generate_turns(client, o.workflow_id)
        check_affinity(turns)
        served.add(turns[0][1])
        assert o.result is not None and o.result.engine_worker == turns[0][1] and o.result.engine_moves == 0
        p = o.result.pressure
        assert p is not None and p.prefix_queries > 0 and 0.0 <= p.kv_usage <= 1.0
    assert served <= set(await _h800_ids(stack))


async def pins(client: Client, job_id: str) -> Counter[str]:
    """The running trajectories of the job by the engine that served their last turn (so far)."""
    query = f'RollartJobId = "{job_id}" AND WorkflowType = "TrajectoryWorkflow" AND ExecutionStatus = "Running"'
    held: Counter[str] = Counter()
    async for wf in client.list_workflows(query):
        spans = activity_spans(await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history())
        served = [s.worker_identity for s in spans if s.activity_type == "generate" and s.succeeded]
        if served:
            held[served[-1]] += 1
    return held


async def _h800_ids(stack: LocalStack) -> list[str]:
    return [stack.worker_id(pid) for pid in stack.live_workers(Pool.H800)]


@pytest.fixture(scope="module")
def two_engines(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[LocalStack]:
    home = tmp_path_factory.mktemp("affinity")
    job = JobSpec(
        name="aff",
        model_dir=tiny_model,
        tasks=[frozenlake_task(group_size=4, max_turns=6, env_args=LONG_GAME)],
        engine=EngineConfig(kind="vllm", max_model_len=256, affinity=AffinityConfig(start_wait_s=2.0, heartbeat_s=6.0)),
        store=StoreConfig(path=home / "store"),
        training=TrainingConfig(steps=STEPS, batch_size=8, async_bound=1),
    )
    pools = [Pool.CONTROL, Pool.CPU, Pool.H800, Pool.H800, Pool.SERVERLESS, Pool.TRAINER]
    stack = LocalStack(job=job, pools=pools, home=home, port=free_port(), ui_port=None, autoscale=False)
    stack.start(timeout_s=300)
    yield stack
    stack.stop()


async def moved_turns(client: Client, job_id: str, victim: str) -> list[str]:
    """Trajectories with a turn pinned to `victim` that it never answered and a next turn on the shared queue,
    served by another engine. A pinned turn with no next turn (yet) is not counted: its trajectory may still be
    waiting out its start wait, or was cancelled when the job ended."""
    moved = []
    async for wf in client.list_workflows(f'RollartJobId = "{job_id}" AND WorkflowType = "TrajectoryWorkflow"'):
        spans = activity_spans(await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history())
        gens = [s for s in spans if s.activity_type == "generate"]
        for lost, after in itertools.pairwise(gens):
            if lost.task_queue == f"h800@{victim}" and not lost.succeeded and after.succeeded:
                assert after.task_queue == "h800" and after.worker_identity not in ("", victim), wf.id
                moved.append(wf.id)
    return moved


@pytest.mark.integration
@pytest.mark.chaos
async def test_an_engine_sigkilled_mid_training_loses_no_trajectory(two_engines: LocalStack, tmp_path: Path) -> None:
    """Once an engine holds a few trajectories in flight, it is SIGKILLed: the turns pinned to it wait out
    their start wait (2 s) or, if it was running them, their heartbeat (`heartbeat_s`, 6 s here) and go to the
    shared queue, where the other
    engine takes them and the trajectories from then on. Once such a move shows in the histories the job is
    stopped; none failed, the ledger balances.

    The job is long and stopped by signal, not left to end by itself: the other engine alone can fill the
    last steps before a pinned turn's start wait runs out, and a job that ends first cancels the pinned
    trajectories before they move (a race CI met with six steps)."""
    stack = two_engines
    client = await connect(stack.temporal, stack.job.store)
    job_id = f"aff-{uuid.uuid4().hex[:6]}"
    job = stack.job.model_copy(update={"training": stack.job.training.model_copy(update={"steps": 1000})})
    handle = await start_training(client, job, job_id, tmp_path)
    deadline, pinned = time.monotonic() + 240, Counter[str]()
    while not pinned or pinned.most_common(1)[0][1] < 3:
        assert time.monotonic() < deadline, f"no engine holds 3 running trajectories: {pinned}"
        await asyncio.sleep(0.5)
        if (await handle.query("status", result_type=TrainingStatus)).step >= 1:
            pinned = await pins(client, job_id)
    victim = pinned.most_common(1)[0][0]  # the engine holding the most trajectories in flight
    by_id = {stack.worker_id(pid): pid for pid in stack.live_workers(Pool.H800)}
    stack.kill_worker(by_id[victim])
    killed_at = (await handle.query("status", result_type=TrainingStatus)).step
    deadline, moved = time.monotonic() + 180, []
    while not moved:
        assert time.monotonic() < deadline, f"no turn pinned to {victim} moved to the other engine in 180 s"
        await asyncio.sleep(1.0)
        moved = await moved_turns(client, job_id, victim)
    await handle.signal("stop")
    result = await asyncio.wait_for(handle.result(), 300)
    status = await handle.query("status", result_type=TrainingStatus)
    assert isinstance(result, TrainingResult) and result.ended_by == "stop_signal", result
    assert result.version >= killed_at and result.failed == 0, result
    assert status.ledger_balanced
