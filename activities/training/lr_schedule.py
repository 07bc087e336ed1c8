"""The learning rate of a training step: warm-up, then constant or cosine (`trainer.lr_schedule`).

A pure function of the step number, not optimizer state: a trainer restarted from a checkpoint, a
continued-as-new job and a replayed step all get the rate the schedule gives that step.
"""

from __future__ import annotations

import math

from rollart.spec.config import TrainerConfig

__all__ = ["lr_at", "scheduled"]


def lr_at(cfg: TrainerConfig, step: int) -> float:
    """The learning rate of 0-based training step `step` under `cfg.lr_schedule`."""
    schedule = cfg.lr_schedule
    if step < schedule.warmup_steps:
        return cfg.lr * (step + 1) / schedule.warmup_steps
    if schedule.kind == "constant":
        return cfg.lr
    if schedule.decay_steps is None:  # TrainingPlan.of fills it from training.steps (TrainerConfig.over)
        raise ValueError("trainer.lr_schedule: a cosine schedule needs decay_steps (or a training plan to fill it in)")
    progress = min(1.0, (step - schedule.warmup_steps) / schedule.decay_steps)
    floor = cfg.lr * schedule.min_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def scheduled(cfg: TrainerConfig, step: int) -> TrainerConfig:
    """`cfg` with `lr` set to the schedule's rate at `step`: what the optimizer steps with."""
    lr = lr_at(cfg, step)
    return cfg if lr == cfg.lr else cfg.model_copy(update={"lr": lr})
