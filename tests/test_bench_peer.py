"""The pure parts of `bench peer_trl` and `bench scale`: TRL's reward is the task's, the per-step numbers, the
2-vs-1 control-process ratio in the results."""

from __future__ import annotations

import json

import pytest

from bench.peer_trl import WARMUP, bench_job, measure
from bench.trl_grpo import TrlRun, _TaskReward
from rollart.activities.envs.arithmetic import Arithmetic
from rollart.contracts.ids import derive_seed


def test_trl_reward_is_the_tasks_exact_match_on_the_envs_answer() -> None:
    job = bench_job(10)
    (task,) = job.tasks
    seeds = [derive_seed(job.training.seed, 0), derive_seed(job.training.seed, 1)]
    answers = []
    for s in seeds:
        env = Arithmetic(**task.env_args)
        env.reset(s)
        answers.append(env.answer)
    run = TrlRun()
    reward = _TaskReward(task, run)
    completions = [answers[0], "x", answers[1], answers[1] + "0"]
    values = reward(prompts=["p"] * 4, completions=completions, seed=[seeds[0], seeds[0], seeds[1], seeds[1]])
    assert values == [1.0, 0.0, 1.0, 0.0]
    assert run.success == [0.5]


def test_the_bench_job_is_the_arithmetic_example_capped() -> None:
    job = bench_job(7)
    (task,) = job.tasks
    assert (task.env, task.reward, task.group_size, job.training.batch_size) == ("arithmetic", "exact_match", 16, 256)
    assert job.training.steps == 7 and job.trainer.loss.entropy_coef == pytest.approx(0.03)


def test_measure_takes_the_median_step_after_warmup_and_the_first_window_at_target() -> None:
    times = [10.0, 20.0, 30.0] + [30.0 + i for i in range(1, 8)]  # warm-up gaps of 10 s, then 1 s per step
    success = [0.0, 0.0, 0.0, 0.0, 0.5, 0.9, 0.9, 0.7, 1.0, 1.0]
    m = measure({"elapsed_s": times, "success": success, "stopped": "max steps"}, target=0.8, window=2)
    assert WARMUP == 3 and m["s_per_step"] == pytest.approx(1.0) and m["wall_s"] == m["s_per_step"]
    assert m["steps_to_target"] == 7 and m["minutes_to_target"] == pytest.approx(times[6] / 60)
    assert m["final_success"] == pytest.approx(1.0) and m["steps"] == 10
    never = measure({"elapsed_s": times, "success": [0.1] * 10, "stopped": "time cap"}, target=0.8, window=2)
    assert never["steps_to_target"] is None and never["minutes_to_target"] is None


def test_scale_results_carry_the_two_vs_one_control_ratio(tmp_path, monkeypatch) -> None:
    import bench.report
    import bench.scale

    monkeypatch.setattr(bench.report, "RESULTS", tmp_path)
    monkeypatch.setattr(
        bench.scale,
        "write_results",
        lambda name, rows, **extra: bench.report.write_results(name, rows, tmp_path, **extra),
    )
    rows = [
        {
            "name": f"64 x {c} control",
            "n": 64,
            "controls": c,
            "wall_s": 10.0 / c,
            "activities_per_s": 40.0 * c,
            "failed": 0,
            "ledger_balanced": True,
        }
        for c in (1, 2)
    ]
    bench.scale.report(rows, 0.05)
    out = json.loads((tmp_path / "scale.json").read_text())
    assert out["control_ratio"] == {"64": pytest.approx(2.0)}
    assert [m["speedup_vs_baseline"] for m in out["modes"]] == [1.0, pytest.approx(2.0)]


def test_the_trl_baseline_follows_the_jobs_learning_rate_schedule() -> None:
    from bench.trl_grpo import _lr_schedule
    from rollart.spec.config import LRScheduleConfig

    assert _lr_schedule(LRScheduleConfig()) == {"lr_scheduler_type": "constant_with_warmup", "warmup_steps": 0}
    cosine = _lr_schedule(LRScheduleConfig(kind="cosine", warmup_steps=5, min_ratio=0.05))
    assert cosine == {
        "lr_scheduler_type": "cosine_with_min_lr",
        "warmup_steps": 5,
        "lr_scheduler_kwargs": {"min_lr_rate": 0.05},
    }
