"""One training loop in two shells: the workflow on a real dev server and the simulator on virtual time make the
same decisions on the same job, because both call workflows/training/loop.py.

The job is synchronous (bound 0: step k trains exactly the groups launched at version k, whatever the timing),
every episode succeeds, and each step measures the same entropy, so every decision is determined: which groups
each step trains, the entropy weight each step trains with (entropy control raises it each step), and the step
at which `training.stop_when` ends the job. On Temporal they are read from the train-step activity's inputs; in
the simulator, which has no activity, from a spy on `loop.after_step`.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from rollart.contracts.activities import RewardResult, SampleRef
from rollart.contracts.training import TrainingInput, TrainingPlan, TrainingResult
from rollart.infra.temporal.search_attributes import ensure_registered
from rollart.simulator import calls as sim_calls
from rollart.simulator.cluster import PoolSpec
from rollart.simulator.models import TaskProfile, TrainerModel
from rollart.simulator.roofline import MODELS
from rollart.simulator.run import Setup, simulate
from rollart.spec.config import JobSpec, TrainerConfig, TrainingConfig
from rollart.spec.pools import Pool, queue_name
from rollart.workflows.training import loop
from tests.support.standins import StandIns, full_marks, standin_workers
from tests.support.tasks import frozenlake_task, with_queue_prefix

pytestmark = pytest.mark.orchestration

ENTROPY = {"action_entropy": 0.1, "entropy": 0.1}  # below the target: the weight rises by a step each time


def job() -> JobSpec:
    task = frozenlake_task(group_size=2, max_turns=2)
    trainer = {"loss": {"entropy_coef": 0.001, "entropy_target": 0.5, "entropy_coef_step": 0.001}}
    training = TrainingConfig(steps=8, batch_size=4, async_bound=0, stop_when={"success": 0.9, "steps": 3})
    return JobSpec(name="loop", tasks=[task], training=training, trainer=trainer)


def decision(step: int, batch: list[SampleRef], trainer: TrainerConfig) -> tuple[Any, ...]:
    """A step's decisions: the step, the groups it trains (by index) and the entropy weight it trains with."""
    return step, sorted({int(x.group_id.rsplit("-g", 1)[1]) for x in batch}), trainer.loss.entropy_coef


async def on_temporal(env: WorkflowEnvironment, prefix: str) -> tuple[TrainingResult, list[tuple[Any, ...]]]:
    await ensure_registered(env.client)
    w = StandIns(prefix=prefix, turns=1, score=full_marks, train_delay_s=0.02, train_metrics=lambda _: dict(ENTROPY))
    job_id = f"loop-{uuid.uuid4().hex[:8]}"
    async with standin_workers(env.client, w):
        handle = await env.client.start_workflow(
            "TrainingWorkflow",
            TrainingInput(job=with_queue_prefix(job(), prefix), job_id=job_id, run_dir="/tmp/unused"),
            id=job_id,
            task_queue=queue_name(Pool.CONTROL, prefix),
            result_type=TrainingResult,
        )
        result = await asyncio.wait_for(handle.result(), 120)
    return result, [decision(x.step, x.samples, x.trainer) for x in w.inputs("train_step")]


def on_the_simulator(monkeypatch: pytest.MonkeyPatch) -> tuple[str | None, list[tuple[Any, ...]]]:
    seen: list[tuple[Any, ...]] = []
    real = loop.after_step

    def after_step(plan, s, trainer, batch, result, now):  # type: ignore[no-untyped-def]
        seen.append(decision(result.step, batch, trainer))
        return real(plan, s, trainer, batch, result, now)

    monkeypatch.setattr(loop, "after_step", after_step)
    monkeypatch.setattr(sim_calls.SimCalls, "_draw_reward", lambda self: RewardResult(value=1.0, success=True))
    setup = Setup(
        name="loop",
        plan=TrainingPlan.of(job()),
        pools=[PoolSpec("h800", "h800", 1)],
        model=MODELS["7b"],
        profiles={"frozenlake": TaskProfile("frozenlake", done_p=1.0, prompt_tokens=32)},
        trainer=TrainerModel(fixed_s=1.0, metrics=dict(ENTROPY)),
        seed=0,
    )
    out, _ = simulate(setup)
    return out.state.ended_by, seen


async def test_the_workflow_and_the_simulator_decide_alike(
    bare_env: WorkflowEnvironment, queue_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, on_temporal_steps = await on_temporal(bare_env, queue_prefix)
    ended_in_sim, in_sim = await asyncio.to_thread(on_the_simulator, monkeypatch)
    assert on_temporal_steps == in_sim
    # what the decisions were: whole groups launched at the step's version, a weight rising by a step each time,
    # and the stop rule ending the job once 3 steps in a row reached 0.9 (not at its cap of 8)
    assert [groups for _, groups, _ in in_sim] == [[0, 1], [2, 3], [4, 5]]
    assert [coef for *_, coef in in_sim] == pytest.approx([0.001, 0.002, 0.003])
    assert result.ended_by == ended_in_sim == "stop_when" and result.version == 3
