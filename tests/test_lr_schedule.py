"""The learning-rate schedule: warm-up, then constant or cosine, as a function of the step alone."""

from __future__ import annotations

import itertools

import pytest

from rollart.activities.training.lr_schedule import lr_at, scheduled
from rollart.contracts.training import TrainingPlan
from rollart.spec.config import JobSpec, TrainerConfig

TASK = {"name": "a", "env": "x", "reward": "y"}


def trainer(**schedule: object) -> TrainerConfig:
    return TrainerConfig(lr=1e-3, lr_schedule=schedule)


def test_constant_is_the_default_and_leaves_the_config_as_it_is() -> None:
    cfg = TrainerConfig(lr=1e-3)
    assert [lr_at(cfg, s) for s in (0, 1, 1000)] == [1e-3] * 3
    assert scheduled(cfg, 7) is cfg


def test_warm_up_climbs_linearly_to_lr_then_holds() -> None:
    cfg = trainer(warmup_steps=4)
    assert [lr_at(cfg, s) for s in range(6)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
    assert scheduled(cfg, 1).lr == pytest.approx(5e-4) and scheduled(cfg, 1).lr_schedule == cfg.lr_schedule


def test_cosine_decays_from_lr_to_its_floor_over_decay_steps_and_stays_there() -> None:
    cfg = trainer(kind="cosine", warmup_steps=2, decay_steps=10, min_ratio=0.1)
    assert lr_at(cfg, 1) == pytest.approx(1e-3)  # the end of warm-up
    assert lr_at(cfg, 2) == pytest.approx(1e-3)  # decay starts at lr
    assert lr_at(cfg, 7) == pytest.approx(1e-4 + 0.5 * 9e-4)  # half way: half way between lr and the floor
    assert lr_at(cfg, 12) == pytest.approx(1e-4) and lr_at(cfg, 500) == pytest.approx(1e-4)
    rates = [lr_at(cfg, s) for s in range(2, 13)]
    assert all(a > b for a, b in itertools.pairwise(rates))


def test_a_cosine_job_decays_over_the_steps_left_after_warm_up() -> None:
    job = JobSpec(
        tasks=[TASK], training={"steps": 100}, trainer={"lr_schedule": {"kind": "cosine", "warmup_steps": 10}}
    )
    assert TrainingPlan.of(job).trainer.lr_schedule.decay_steps == 90  # what the train steps get
    kept = JobSpec(tasks=[TASK], trainer={"lr_schedule": {"kind": "cosine", "decay_steps": 7}})
    assert TrainingPlan.of(kept).trainer.lr_schedule.decay_steps == 7
    with pytest.raises(ValueError, match="needs decay_steps"):
        lr_at(job.trainer, 20)
    with pytest.raises(ValueError, match="min_ratio"):
        JobSpec(tasks=[TASK], trainer={"lr_schedule": {"kind": "cosine", "min_ratio": 2}})
    with pytest.raises(ValueError, match="kind"):
        JobSpec(tasks=[TASK], trainer={"lr_schedule": {"kind": "linear"}})
