"""Adaptive entropy control (`trainer.loss.entropy_target`): the entropy bonus's weight for the next step.

Skywork-OR1's rule: after a step whose mean entropy (over tokens, or over actions with `entropy_over: actions`)
was below the target the weight rises by a fixed increment, after one above it falls by as much, kept within
[0, `entropy_coef_max`]. The weight lives in the training workflow's state, so a retried step (same input) and
a resumed job (continue-as-new) use the same one. Pure and deterministic: workflow code.
"""

from __future__ import annotations

from rollart.spec.config import LossConfig, TrainerConfig

__all__ = ["measured", "next_coef", "trainer_for_step"]


def measured(loss: LossConfig) -> str:
    """The step metric the rule compares with the target: the entropy the bonus acts on."""
    return "action_entropy" if loss.entropy_over == "actions" else "entropy"


def next_coef(loss: LossConfig, coef: float, entropy: float | None) -> float:
    """The weight after a step that ran with `coef` and measured `entropy` (None: not measured, unchanged)."""
    if loss.entropy_target is None or entropy is None:
        return coef
    delta = loss.entropy_coef_step if entropy < loss.entropy_target else -loss.entropy_coef_step
    return round(min(max(coef + delta, 0.0), loss.entropy_coef_max), 12)  # no float dust in the records


def trainer_for_step(trainer: TrainerConfig, coef: float | None) -> TrainerConfig:
    """`trainer` with the loss's entropy weight set to the adaptive `coef` (None: as configured)."""
    if coef is None or trainer.loss.entropy_target is None or coef == trainer.loss.entropy_coef:
        return trainer
    return trainer.model_copy(update={"loss": trainer.loss.model_copy(update={"entropy_coef": coef})})
