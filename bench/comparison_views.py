"""The views of the comparison suite's tables (`python -m bench all`: end_to_end, affinity, engines, overhead):
the rows and columns each shows, from the results files in the shape its benchmark writes. bench/tables.py
registers them beside bench/table_views.py's.
"""

from __future__ import annotations

from bench.table_views import NAME, Col, Row, View, fixed, modes, pair, pct, repeats, thousands

__all__ = ["COMPARISON_VIEWS"]


def _paper(row: Row) -> str:
    """end_to_end's paper column: the RollArt paper's end-to-end speedup, for the modes it measured."""
    if row["name"].startswith("batch b0"):
        return "1.00"
    return "1.35–2.05" if row["name"].startswith("traj") else ""


def _server_and_control(row: Row) -> float | None:
    """CPU cores of the Temporal server and the control workers together (older runs recorded only the sum)."""
    if row.get("cores_temporal-server") is not None and row.get("cores_control") is not None:
        return row["cores_temporal-server"] + row["cores_control"]
    return row.get("cores_server_and_control")


_E2E_HEAD = (
    NAME,
    Col("wall s (median)", "wall_s", ".1f"),
    Col("each repeat", repeats, align="l"),
    Col("vs sync", "speedup_vs_baseline", ".2f", bold=True),
)
_END_TO_END = (
    *_E2E_HEAD,
    Col("paper", _paper, align="l"),
    Col("traj/s", "trajectories_per_s", ".1f"),
    Col("gen busy", "busy_generation", pct),
    Col("h800 / h20 busy", pair("busy_h800", "busy_h20", pct), align="l"),
    Col("cpu (env) busy", "busy_cpu", pct),
    Col("trainer busy", "busy_trainer", pct),
    Col("dropped (stale)", "dropped", thousands),
)
_END_TO_END_TIME = (
    NAME,
    Col("activities", "activities", thousands),
    Col("Temporal wait ms / act", "wait_ms_p50", ".0f"),
    Col("return ms / act", "return_ms_p50", ".0f"),
    Col("generate p50 s", "generate_p50_s", ".3f"),
    Col("reset_group p50 / max s", pair("reset_p50_s", "reset_max_s", fixed(2)), align="l"),
    Col("server cores", "cores_temporal-server", ".2f"),
    Col("control cores", "cores_control", ".2f"),
    Col("h800 cores", "cores_h800", ".2f"),
)
_END_TO_END_TRAJECTORY = (
    *_E2E_HEAD,
    Col("traj/s", "trajectories_per_s", ".1f"),
    Col("gen busy", "busy_generation", pct),
    Col("activities", "activities", thousands),
    Col("wait ms / act", "wait_ms_p50", ".0f"),
    Col("return ms / act", "return_ms_p50", ".0f"),
    Col("server + control cores", _server_and_control, ".2f"),
)
_END_TO_END_SOKOBAN = (
    *_E2E_HEAD,
    Col("traj/s", "trajectories_per_s", ".1f"),
    Col("gen busy", "busy_generation", pct),
    Col("activities", "activities", thousands),
    Col("return ms / act", "return_ms_p50", ".0f"),
    Col("reset max s", "reset_max_s", ".2f"),
)
_END_TO_END_UNITS = (
    Col("unit (bound 1)", "name", align="l"),
    *_E2E_HEAD[1:],
    Col("traj/s", "trajectories_per_s", ".1f"),
    Col("unit p99 s", "unit_p99_s", ".2f"),
    Col("activities", "activities", thousands),
    Col("wait ms / act", "wait_ms_p50", ".0f"),
    Col("server cores", "cores_temporal-server", ".2f"),
    Col("server ms / traj", "server_cpu_ms_per_traj", ".0f"),
    Col("gen busy", "busy_generation", pct),
)
_END_TO_END_PLACEMENT = (
    Col("placement (traj b1)", "name", align="l"),
    Col("wall s (median)", "wall_s", ".1f"),
    Col("each repeat", repeats, align="l"),
    Col("vs declared", "speedup_vs_baseline", ".2f", bold=True),
    Col("traj/s", "trajectories_per_s", ".1f"),
    Col("h800 busy", "busy_h800", pct),
    Col("h20 busy", "busy_h20", pct),
    Col("unit p99 s", "unit_p99_s", ".2f"),
    Col("where auto ended (the repeats' distinct ends)", "placement", align="l"),
)
_OVERHEAD_GENERATE = (
    Col("path, unit", "name", align="l"),
    Col("wall s (median)", "wall_s", ".2f"),
    Col("each repeat", repeats, align="l"),
    Col("vs asyncio", "speedup_vs_baseline", ".2f", bold=lambda r: not r["name"].startswith("asyncio")),
    Col("traj/s", "trajectories_per_s", ".1f"),
    Col("trajectory s", "trajectory_s", ".2f"),
)
_AFFINITY = (
    Col("layout", "name", align="l"),
    Col("wall s (median)", "wall_s", ".1f"),
    Col("each repeat", repeats, align="l"),
    Col("vs one pool", "speedup_vs_baseline", ".2f", bold=True),
    Col("traj/s", "trajectories_per_s", ".1f"),
    Col("gen busy (any)", "busy_generation", pct),
    Col("per-worker busy (min / max)", pair("gen_worker_busy_min", "gen_worker_busy_max", pct), align="l"),
    Col("generate p50 s", "generate_p50_s", ".3f"),
    Col("trainer busy", "busy_trainer", pct),
)
_ENGINES_AFFINITY = (
    Col("mode", "name", align="l"),
    Col("wall s (median)", "wall_s", ".1f"),
    Col("each repeat", repeats, align="l"),
    Col("prefix-cache hits", "prefix_hit_rate", pct, bold=True),
    Col("tokens/s", "tokens_per_s", thousands),
    Col("traj/s", "trajectories_per_s", ".2f"),
    Col("engine moves / traj", "moves_per_trajectory", ".2f"),
    Col("failed", "failed", ".0f"),
)
_ENGINES_ADMISSION = (
    Col("admission", "name", align="l"),
    Col("wall s (median)", "wall_s", ".1f"),
    Col("each repeat", repeats, align="l"),
    Col("vs fixed", "speedup_vs_baseline", ".2f", bold=True),
    Col("traj/s", "trajectories_per_s", ".2f"),
    Col("completion tok/s", "completion_tokens_per_s", ".0f"),
    Col("preempted", "preempted", ".0f"),
    Col("KV max", "kv_usage_max", pct),
    Col("cap min / end", pair("cap_min", "cap_end", fixed(0)), align="l"),
    Col("failed", "failed", ".0f"),
)
_OVERHEAD = (
    Col("path, unit, env latency", "name", align="l"),
    Col("wall s", "wall_s", ".2f"),
    Col("vs asyncio", "speedup_vs_baseline", ".2f", bold=lambda r: not r["name"].startswith("asyncio")),
    Col("traj/s", "trajectories_per_s", ".1f"),
    Col("trajectory s", "trajectory_s", ".2f"),
    Col("activities / traj", "activities_per_trajectory", ".2g"),
    *(
        Col(header, key, fmt, missing="")
        for header, key, fmt in (
            ("work ms / act", "work_ms", ".0f"),
            ("wait ms", "wait_ms", ".0f"),
            ("return ms", "return_ms", ".0f"),
            ("overhead ms / act (histories)", "overhead_ms_per_activity", ".0f"),
            ("share", "overhead_share", pct),
            ("extra ms / act", "extra_ms_per_activity", ".0f"),
            ("extra share", "extra_share", pct),
        )
    ),
)


COMPARISON_VIEWS: dict[str, View] = {
    "end_to_end": View(("end_to_end",), modes, _END_TO_END),
    "end_to_end.time": View(("end_to_end",), modes, _END_TO_END_TIME),
    "end_to_end-trajectory": View(("end_to_end-trajectory",), modes, _END_TO_END_TRAJECTORY),
    "end_to_end-sokoban": View(("end_to_end-sokoban",), modes, _END_TO_END_SOKOBAN),
    "end_to_end-sokoban-units": View(("end_to_end-sokoban-units",), modes, _END_TO_END_UNITS),
    "end_to_end-placement": View(("end_to_end-placement",), modes, _END_TO_END_PLACEMENT),
    "affinity": View(("affinity",), modes, _AFFINITY),
    "engines-affinity": View(("engines-affinity",), modes, _ENGINES_AFFINITY),
    "engines-admission": View(("engines-admission",), modes, _ENGINES_ADMISSION),
    "overhead": View(("overhead",), modes, _OVERHEAD),
    "overhead-generate": View(("overhead-generate",), modes, _OVERHEAD_GENERATE),
}
