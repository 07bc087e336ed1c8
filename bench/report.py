"""The comparison every benchmark prints: medians of repeats, each mode's ratio to the baseline of the same run.

Pure functions (no Temporal, no engine): `summarize` turns per-repeat
measurements into one row per mode with `speedup_vs_baseline`, `format_table`
prints them, `write_results` writes `bench/results/NAME.json` (a `modes` list
plus whatever else the benchmark reports) and `plot_modes` draws the PNG.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["RESULTS", "format_table", "plot_modes", "summarize", "write_results"]

RESULTS = Path(__file__).parent / "results"


def summarize(runs: dict[str, list[dict[str, Any]]], baseline: str) -> list[dict[str, Any]]:
    """One row per mode (in `runs`' order): the median of every numeric field over its repeats.

    `runs[mode]` is that mode's list of repeats, each a dict with at least `wall_s`.
    `speedup_vs_baseline` = baseline's median wall / this mode's median wall (> 1: faster than the
    baseline); `repeats` and each repeat's `wall_s` (`walls_s`) are kept so spread stays visible.
    """
    if baseline not in runs or not runs[baseline]:
        raise ValueError(f"baseline {baseline!r} has no measurements; modes: {', '.join(runs) or '(none)'}")
    rows = []
    for name, repeats in runs.items():
        if not repeats:
            continue
        keys = [k for k in repeats[0] if all(_numeric(r.get(k)) for r in repeats)]
        row: dict[str, Any] = {"name": name, **{k: statistics.median(r[k] for r in repeats) for k in keys}}
        row["repeats"] = len(repeats)
        row["walls_s"] = [r["wall_s"] for r in repeats]
        texts = {k for r in repeats for k, v in r.items() if isinstance(v, str)}  # kept per repeat, e.g. a placement
        row |= {k: "; ".join(dict.fromkeys(str(r.get(k, "-")) for r in repeats)) for k in sorted(texts)}
        rows.append(row)
    base_wall = next(r["wall_s"] for r in rows if r["name"] == baseline)
    for row in rows:
        row["speedup_vs_baseline"] = base_wall / row["wall_s"] if row["wall_s"] > 0 else float("nan")
    return rows


def _numeric(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, str]]) -> str:
    """A fixed-width text table; `columns` are (key, header, format spec such as `.2f` or `.0%`)."""
    cells = [[h for _, h, _ in columns]]
    for row in rows:
        cells.append([_cell(row.get(k), spec) for k, _, spec in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = []
    for n, r in enumerate(cells):
        first = r[0].ljust(widths[0])
        lines.append("  " + "  ".join([first, *(c.rjust(w) for c, w in zip(r[1:], widths[1:]))]))
        if n == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value: object, spec: str) -> str:
    if value is None:
        return "-"
    if _numeric(value) and spec:
        return format(value, spec)
    return str(value)


def write_results(name: str, rows: Sequence[dict[str, Any]], directory: Path = RESULTS, **extra: Any) -> Path:
    """`directory/NAME.json`: `{"benchmark": NAME, "modes": rows, ...extra}`."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, "modes": list(rows), **extra}, indent=2, default=str))
    return path


def plot_modes(
    name: str,
    rows: Sequence[dict[str, Any]],
    title: str,
    directory: Path = RESULTS,
    extra_key: str | None = None,
    extra_label: str = "",
) -> Path:
    """`directory/NAME.png`: median wall time per mode, labelled with its ratio to the baseline;
    with `extra_key`, a second panel of that field per mode (e.g. trajectories/s)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 2 if extra_key else 1
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 3.6), squeeze=False)
    names = [r["name"] for r in rows]
    ax = axes[0][0]
    bars = ax.bar(names, [r["wall_s"] for r in rows], color="#4C72B0")
    for bar, r in zip(bars, rows):
        ratio = r.get("speedup_vs_baseline")
        ax.annotate(
            f"{ratio:.2f}x" if _numeric(ratio) else "-",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=9,
        )
    ax.set_ylabel("wall s (median)")
    ax.set_title("wall time, ratio vs baseline")
    if extra_key:
        ax2 = axes[0][1]
        ax2.bar(names, [r.get(extra_key, 0.0) for r in rows], color="#55A868")
        ax2.set_ylabel(extra_label or extra_key)
        ax2.set_title(extra_label or extra_key)
    for a in axes[0]:
        a.tick_params(axis="x", labelrotation=20, labelsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
