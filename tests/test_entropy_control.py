"""Adaptive entropy control (`trainer.loss.entropy_target`): the rule by hand, its config, and the training
workflow carrying the weight from step to step, across continue-as-new, into each train_step's input."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from temporalio.testing import WorkflowEnvironment

from rollart.contracts.activities import TrainStepInput
from rollart.spec.config import LossConfig, TrainerConfig
from rollart.workflows.entropy_control import next_coef, trainer_for_step
from tests.test_training_workflow import assert_ledger, job, train, world


def test_the_weight_rises_below_the_target_falls_above_and_stays_in_bounds() -> None:
    loss = LossConfig(entropy_target=0.5, entropy_coef_step=0.002, entropy_coef_max=0.005)
    coef, seen = 0.0, []
    for entropy in (0.1, 0.1, 0.1, 0.1, 0.9, None, 0.9, 0.9, 0.9, 0.9):
        coef = next_coef(loss, coef, entropy)
        seen.append(round(coef, 6))
    assert seen == [0.002, 0.004, 0.005, 0.005, 0.003, 0.003, 0.001, 0.0, 0.0, 0.0]
    assert next_coef(LossConfig(), 0.0, 0.01) == 0.0  # no target: the configured weight, whatever the entropy


def test_the_step_gets_the_adaptive_weight_only_with_a_target() -> None:
    adaptive = TrainerConfig(loss=LossConfig(entropy_target=0.3))
    assert trainer_for_step(adaptive, 0.004).loss.entropy_coef == 0.004
    assert trainer_for_step(adaptive, None) is adaptive
    fixed = TrainerConfig(loss=LossConfig(entropy_coef=0.01))
    assert trainer_for_step(fixed, 0.004) is fixed


def test_a_start_above_the_cap_is_refused_with_both_values() -> None:
    with pytest.raises(ValidationError, match=r"entropy_coef \(0.05\).*entropy_coef_max \(0.01\)"):
        LossConfig(entropy_target=0.3, entropy_coef=0.05)
    LossConfig(entropy_coef=0.05)  # without a target, the weight is fixed and any value goes


@pytest.mark.orchestration
async def test_the_workflow_carries_the_weight_across_steps_and_continue_as_new(
    bare_env: WorkflowEnvironment, queue_prefix: str
) -> None:
    """Entropies 0.1 (below the 0.3 target) for steps 0–3, then 0.9: weights 0, .001, .002, .003, .004, .003."""

    def metrics(inp: TrainStepInput) -> dict[str, float]:
        return {"loss": 0.0, "entropy": 0.1 if inp.step < 4 else 0.9}

    w = world(queue_prefix, train_metrics=metrics)
    spec = job(steps=6, continue_as_new_every=2)
    loss = LossConfig(entropy_target=0.3, entropy_coef_step=0.001, entropy_coef_max=0.01)
    spec = spec.model_copy(update={"trainer": spec.trainer.model_copy(update={"loss": loss})})
    result, status = await train(bare_env, w, spec)
    coefs = [round(inp.trainer.loss.entropy_coef, 6) for inp in w.inputs("train_step")]
    assert [inp.step for inp in w.inputs("train_step")] == list(range(6))
    assert coefs == [0.0, 0.001, 0.002, 0.003, 0.004, 0.003]
    assert result.version == 6 and status.ledger_balanced
    assert_ledger(result)
