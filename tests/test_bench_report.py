"""The benchmarks' pure parts: medians of repeats, ratios against the baseline, the table, the JSON and PNG."""

from __future__ import annotations

import json

import pytest

from bench.__main__ import summary
from bench.report import format_table, plot_modes, summarize, write_results
from bench.weight_sync import as_modes
from bench.workload import LATENCY, SOKOBAN_LATENCY, multitask_job
from rollart.activities.envs.gem_env import GemEnv
from rollart.spec.pools import Pool
from rollart.spec.routing import Unit, unit_of


def test_summarize_takes_medians_and_ratios_against_the_baseline() -> None:
    runs = {
        "sync": [{"wall_s": 10.0, "tps": 1.0}, {"wall_s": 12.0, "tps": 3.0}, {"wall_s": 11.0, "tps": 2.0}],
        "async": [{"wall_s": 5.0, "tps": 4.0, "note": "x"}, {"wall_s": 6.0, "tps": 4.0, "note": "y"}],
    }
    rows = summarize(runs, "sync")
    assert [r["name"] for r in rows] == ["sync", "async"]
    sync, fast = rows
    assert sync["wall_s"] == 11.0 and sync["tps"] == 2.0 and sync["speedup_vs_baseline"] == 1.0
    assert fast["wall_s"] == 5.5 and fast["speedup_vs_baseline"] == pytest.approx(2.0)
    assert fast["repeats"] == 2 and fast["walls_s"] == [5.0, 6.0]
    assert fast["note"] == "x; y"  # a text field is not a median: each repeat's distinct values, in order


def test_summarize_needs_the_baseline() -> None:
    with pytest.raises(ValueError, match="baseline 'sync'"):
        summarize({"async": [{"wall_s": 1.0}]}, "sync")


def test_table_json_and_png(tmp_path) -> None:
    rows = summarize({"base": [{"wall_s": 2.0, "busy": 0.5}], "new": [{"wall_s": 1.0}]}, "base")
    text = format_table(
        rows,
        [
            ("name", "mode", ""),
            ("wall_s", "wall s", ".1f"),
            ("busy", "busy", ".0%"),
            ("speedup_vs_baseline", "vs base", ".2f"),
        ],
    )
    lines = text.splitlines()
    assert "mode" in lines[0] and set(lines[1].strip()) <= {"-", " "}
    assert "50%" in lines[2] and "2.00" in lines[3] and lines[3].split()[-2] == "-"  # missing field shows "-"
    path = write_results("demo", rows, directory=tmp_path, steps=3)
    data = json.loads(path.read_text())
    assert data["benchmark"] == "demo" and data["steps"] == 3
    for mode in data["modes"]:
        assert {"name", "wall_s", "speedup_vs_baseline"} <= set(mode)
    png = plot_modes("demo", rows, "demo", directory=tmp_path, extra_key="busy")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_workload_injects_its_latency_through_the_fault_model(tmp_path) -> None:
    job = multitask_job(tmp_path, 3)
    frozenlake, arithmetic = job.tasks
    assert frozenlake.faults is not None and arithmetic.faults is None
    assert (frozenlake.faults.reset_latency.median_s, frozenlake.faults.reset_latency.p99_s) == (
        LATENCY["reset_median_s"],
        LATENCY["reset_p99_s"],
    )
    assert frozenlake.rollout_unit == "group" and unit_of(frozenlake, "batch") is Unit.GROUP
    assert multitask_job(tmp_path, 3, rollout_unit="trajectory").tasks[0].rollout_unit == "trajectory"
    assert {t.generate_pool for t in multitask_job(tmp_path, 3, single_pool=Pool.H800).tasks} == {"h800"}


def test_sokoban_joins_the_mix_with_its_own_latency(tmp_path) -> None:
    job = multitask_job(tmp_path, 3, sokoban=True)
    assert [t.name for t in job.tasks] == ["frozenlake", "arithmetic", "sokoban"]
    sokoban = job.tasks[2]
    assert (sokoban.env, sokoban.env_args["id"], sokoban.reward) == ("gem", "game:Sokoban-v0-easy", "env_return")
    assert sokoban.faults is not None and sokoban.faults.reset_latency.p99_s == SOKOBAN_LATENCY["reset_p99_s"]
    assert sokoban.faults.step_latency.median_s > job.tasks[0].faults.step_latency.median_s
    env = GemEnv(**sokoban.env_args)  # the workload's args play: a one-letter move is a move
    env.reset(0)
    assert env.step("u").info["valid"]


def test_weight_sync_modes_compare_each_size_with_the_local_file() -> None:
    transfer = [
        {"size": "2.5M", "backend": b, "publish_s": p, "pull_s": q}
        for b, p, q in [("mooncake", 0.02, 0.02), ("local file", 0.01, 0.01), ("socket", 0.01, 0.03)]
    ]
    swap = [
        {"model": "tiny", "store": "mooncake", "total_s": 0.3},
        {"model": "tiny", "store": "local file", "total_s": 0.24},
    ]
    rows = {r["name"]: r for r in as_modes(transfer, swap)}
    assert rows["2.5M mooncake"]["wall_s"] == pytest.approx(0.04)
    assert rows["2.5M mooncake"]["speedup_vs_baseline"] == pytest.approx(0.5)
    assert rows["2.5M socket"]["speedup_vs_baseline"] == pytest.approx(0.5)
    assert rows["swap tiny mooncake"]["speedup_vs_baseline"] == pytest.approx(0.8)
    assert rows["2.5M local file"]["speedup_vs_baseline"] == 1.0


def test_all_ends_with_every_mode_against_its_baseline(tmp_path, monkeypatch) -> None:
    import bench.report

    monkeypatch.setattr(bench.report, "RESULTS", tmp_path)
    write_results("end_to_end", summarize({"sync": [{"wall_s": 20.0}], "async": [{"wall_s": 8.0}]}, "sync"), tmp_path)
    write_results("affinity", summarize({"one": [{"wall_s": 6.0}], "two": [{"wall_s": 5.0}]}, "one"), tmp_path)
    lines = summary(["end_to_end", "affinity"], {"end_to_end": 61.0, "affinity": 90.0}).splitlines()
    assert any("end_to_end: async" in line and "2.50" in line for line in lines)
    assert any("affinity: one" in line and "1.00" in line and "90" in line for line in lines)
    assert any("affinity: two" in line and "1.20" in line for line in lines)


def test_learning_measures_time_to_target_and_how_well_it_holds() -> None:
    from bench.learning import measure, summary_rows

    success = [0.0] * 10 + [0.9] * 5 + [0.7] * 5 + [1.0] * 10  # 30 steps: the 5-step mean reaches 0.8 at step 15
    run = {"success": success, "elapsed_s": [60.0 * (i + 1) for i in range(30)]}
    m = measure(run, target=0.8, window=5)
    assert m["steps_to_target"] == 15 and m["minutes_to_target"] == 15.0
    assert m["stable_share"] == 1.0  # the last 20 % (6 steps) are all 1.0
    assert m["last50"] == sum(success) / 30
    never = measure({"success": [0.5] * 30, "elapsed_s": list(range(30))}, target=0.8, window=5)
    assert never["steps_to_target"] is None and never["stable_share"] == 0.0
    rows = summary_rows(
        [
            {**m, "bound": 1, "seed": 0, "eval": 0.9, "filtered": 0, "dropped": 3},
            {**never, "bound": 1, "seed": 1, "eval": 0.5, "filtered": 0, "dropped": 5},
        ]
    )
    assert rows[0]["reached"] == 1 and rows[0]["steps_to_target"] == 15 and rows[0]["eval"] == 0.7


def test_learning_runs_the_examples_full_length_unless_told_to_stop() -> None:
    """The curves compare runs of one length: the example's `training.stop_when` is off unless a --set puts it back."""
    from bench.learning import bench_job

    job = bench_job("frozenlake", [], 30)
    assert job.training.stop_when is None and job.training.steps == 30
    kept = bench_job("frozenlake", ["training.stop_when={success: 0.9, steps: 5}"], None)
    assert kept.training.stop_when is not None and kept.training.stop_when.steps == 5 and kept.training.steps == 200
