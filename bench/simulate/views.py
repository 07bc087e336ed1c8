"""The docs' tables of bench/results/simulate.json, as `python -m bench tables` views (bench/table_views.py).

Kept beside the simulator; bench/table_views.py takes them in with `VIEWS.update(SIMULATE_VIEWS)`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.table_views import Col, Row, View, fixed, pct

__all__ = ["SIMULATE_VIEWS"]


def _part(key: str) -> Callable[[list[dict[str, Any]]], list[Row]]:
    return lambda docs: [r for d in docs for r in d.get("parts", {}).get(key, {}).get("rows", [])]


def _calibration_parts(docs: list[dict[str, Any]]) -> list[Row]:
    rows = []
    for d in docs:
        for key, part in sorted(d.get("parts", {}).items()):
            if key.startswith("calibration "):
                rows += [{**r, "job": key.removeprefix("calibration ")} for r in part["rows"]]
    return rows


def _ended(row: Row) -> str | None:
    """Where each task generated at the run's end: "frozenlake, sokoban → h800; arithmetic → h20"."""
    where = row.get("placement_end")
    if not where:
        return None
    pools: dict[str, list[str]] = {}
    for task, pool in where.items():
        pools.setdefault(pool, []).append(task)
    return "; ".join(f"{', '.join(tasks)} → {pool}" for pool, tasks in pools.items())


_PAPER = (
    Col("run", "name", align="l"),
    Col("steps / h", "steps_per_hour", ".0f"),
    Col("step s", "step_s", ".1f"),
    Col("trained / s", "trained_per_s", ".1f"),
    Col("vs batch b0", "vs_sync", fixed(2, "x")),
    Col("vs traj b0", "vs_traj_sync", fixed(2, "x")),
    Col("trajectory p99 s", "trajectory_p99_s", ".0f"),
    Col("h800 busy", "busy_h800", pct),
    Col("h20 busy", "busy_h20", pct),
    Col("trainer busy", "busy_trainer", pct),
    Col("failed", "failed", ".0f"),
    Col("dropped", "dropped", ".0f"),
)
_UNITS = (
    Col("run", "name", align="l"),
    Col("steps / h", "steps_per_hour", ".0f"),
    Col("trained / s", "trained_per_s", ".1f"),
    Col("vs sync", "vs_sync", fixed(2, "x")),
    Col("trajectory p99 s", "trajectory_p99_s", ".0f"),
    Col("h800 busy", "busy_h800", pct),
    Col("failed", "failed", ".0f"),
    Col("dropped", "dropped", ".0f"),
    Col("calls", "calls", ".0f"),
)
_PLACEMENT = (
    Col("placement", "name", align="l"),
    Col("planned (spec/placement.py)", lambda r: "chosen" if r["chosen"] else "", align="l"),
    Col("planned step s", "predicted_step_s", ".2f"),
    Col("trained / s", "trained_per_s", ".2f"),
    Col("vs best hand-written", "vs_best", fixed(3, "x")),
    Col("h800 busy", "busy_h800", pct),
    Col("h20 busy", "busy_h20", pct),
    Col("moves", "placement_moves", ".0f"),
    Col("tasks at the end", _ended, align="l"),
)
_PRIORITY = (
    Col("max_num_seqs", "max_num_seqs", ".0f"),
    Col("engine.priority", "priority", align="l"),
    Col("steps / h", "steps_per_hour", ".0f"),
    Col("trained / s", "trained_per_s", ".2f"),
    Col("vs fifo", "vs_fifo", fixed(3, "x")),
    Col("trajectory p50 s", "trajectory_p50_s", ".1f"),
    Col("trajectory p99 s", "trajectory_p99_s", ".1f"),
    Col("p99 vs fifo", "p99_vs_fifo", fixed(3, "x")),
    Col("h800 busy", "busy_h800", pct),
    Col("h20 busy", "busy_h20", pct),
    Col("dropped", "dropped", ".0f"),
)
_CALIBRATION = (
    Col("job", "job", align="l"),
    Col("mode", "name", align="l"),
    Col("simulated s", "predicted_s", ".1f"),
    Col("measured s", "measured_s", ".1f"),
    Col("simulated vs sync", "predicted_ratio", fixed(2, "x")),
    Col("measured vs sync", "measured_ratio", fixed(2, "x")),
    Col("ratio error", "ratio_error", lambda v: f"{100 * v:+.0f} %"),
    Col("time error", "wall_error", lambda v: f"{100 * v:+.0f} %"),
    Col("measured repeats s", lambda r: " / ".join(f"{w:.1f}" for w in r.get("measured_walls_s") or []) or None),
    Col("activities (sim / measured)", lambda r: f"{r['calls']} / {r.get('measured_activities') or '–'}"),
)
_TIMING = (
    Col("run", "name", align="l"),
    Col("GPUs", "gpus", ",.0f"),
    Col("in flight + buffered, at most", "peak_in_flight", ",.0f"),
    Col("simulated s", "sim_s", ".0f"),
    Col("calls", "calls", ",.0f"),
    Col("wall min / simulated h", "wall_per_sim_hour_s", lambda v: f"{v / 60:.1f}"),
    Col("CPU min / simulated h", "cpu_per_sim_hour_s", lambda v: f"{v / 60:.1f}"),
)

SIMULATE_VIEWS: dict[str, View] = {
    "simulate.paper": View(("simulate",), _part("paper"), _PAPER),
    "simulate.units": View(("simulate",), _part("units"), _UNITS),
    "simulate.placement": View(("simulate",), _part("placement"), _PLACEMENT),
    "simulate.priority": View(("simulate",), _part("priority"), _PRIORITY),
    "simulate.calibration": View(("simulate",), _calibration_parts, _CALIBRATION),
    "simulate.timing": View(
        ("simulate",), lambda docs: _part("timing group")(docs) + _part("timing trajectory")(docs), _TIMING
    ),
}
