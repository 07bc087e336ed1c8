"""`generate_pool: auto` in a running job, against a real dev server with stand-in activities (no engine).

Two auto tasks start spread over h800 and h20. The stand-in engines report h800 100x faster than h20, so the
plan made after step 2 puts both tasks on h800: later trajectories generate there, and the status, the step
records and the workflow's memo (what the Temporal UI shows) say where and why.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.testing import WorkflowEnvironment

from rollart.contracts.training import TrainingStatus
from rollart.infra.temporal.search_attributes import ensure_registered
from rollart.spec.config import JobSpec, TrainingConfig
from tests.support.standins import StandIns, full_marks, standin_workers, start_training
from tests.support.tasks import frozenlake_task, with_queue_prefix

pytestmark = pytest.mark.orchestration


async def test_auto_tasks_move_to_the_faster_pool_and_the_plan_is_shown(
    bare_env: WorkflowEnvironment, queue_prefix: str
) -> None:
    w = StandIns(prefix=queue_prefix, turns=1, score=full_marks, pool_rates={"h800": 10_000.0, "h20": 100.0})
    tasks = [frozenlake_task(name=n, generate_pool="auto", group_size=2, max_turns=2) for n in ("a", "b")]
    training = TrainingConfig(steps=6, batch_size=4, async_bound=1, placement={"every_steps": 2})
    spec = with_queue_prefix(JobSpec(name="auto", tasks=tasks, training=training), queue_prefix)
    await ensure_registered(bare_env.client)
    job_id = f"auto-{uuid.uuid4().hex[:8]}"
    async with standin_workers(bare_env.client, w):
        handle = await start_training(bare_env.client, spec, job_id, queue_prefix)
        result = await asyncio.wait_for(handle.result(), 120)
        status = await handle.query("status", result_type=TrainingStatus)
        memo = await (await handle.describe()).memo()

    assert result.failed == 0 and result.steps == 6
    served = {c.inp.data_key: c.queue.removeprefix(queue_prefix) for c in w.called("generate")}
    trained = [
        (s.task, served[k], inp.step) for inp in w.inputs("train_step") for s in inp.samples for k in s.turn_keys
    ]
    # the spread: steps 0 and 1 train groups launched before the first plan (which of them finish first is a race)
    assert {(task, pool) for task, pool, step in trained if step <= 1} == {("a", "h800"), ("b", "h20")}
    assert {pool for _, pool, step in trained if step >= 4} == {"h800"}  # launched after the plan at step 2
    p = status.placement
    assert p is not None and p.assignment == {"a": "h800", "b": "h800"} and p.moves == 1 and p.plans >= 2
    assert p.rates["h800"][1] == pytest.approx(10_000) and p.rates["h20"][1] == pytest.approx(100)
    plans = {r.step: r.placement_plan for r in status.history if r.placement_plan}
    assert plans[1][0].startswith("placement (step 2): a → h800, b → h800") and plans[1][-1] == "moved"
    assert [r.placement for r in status.history][:2] == [{"a": "h800", "b": "h20"}] * 2
    assert memo["placement"] == p.describe() and memo["placement_reasons"] == p.reasons
