"""The benchmarks' pure parts: medians of repeats, ratios against the baseline, the table, the JSON and PNG."""

from __future__ import annotations

import json
import math
import random

import pytest
from bench.report import format_table, plot_modes, summarize, write_results
from bench.workload import LATENCY, lognormal


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
    assert "note" not in fast  # non-numeric fields are not medians


def test_summarize_needs_the_baseline() -> None:
    with pytest.raises(ValueError, match="baseline 'sync'"):
        summarize({"async": [{"wall_s": 1.0}]}, "sync")


def test_table_json_and_png(tmp_path) -> None:
    rows = summarize({"base": [{"wall_s": 2.0, "busy": 0.5}], "new": [{"wall_s": 1.0}]}, "base")
    text = format_table(rows, [("name", "mode", ""), ("wall_s", "wall s", ".1f"), ("busy", "busy", ".0%"),
                               ("speedup_vs_baseline", "vs base", ".2f")])  # fmt: skip
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


def test_lognormal_latency_has_the_stated_median_and_p99() -> None:
    rng = random.Random(1)
    draws = sorted(lognormal(LATENCY["reset_median_s"], LATENCY["reset_p99_s"], rng) for _ in range(20000))
    assert draws[len(draws) // 2] == pytest.approx(LATENCY["reset_median_s"], rel=0.05)
    assert draws[int(0.99 * len(draws))] == pytest.approx(LATENCY["reset_p99_s"], rel=0.15)
    assert lognormal(0.0, 0.0, rng) == 0.0 and not math.isnan(lognormal(0.1, 0.1, rng))
