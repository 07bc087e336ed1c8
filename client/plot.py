"""`rollart plot RUN_DIR`: learning curves and the rollout timeline as PNGs, from the run dir's files."""

from __future__ import annotations

import json
from pathlib import Path

from rollart.contracts.training import played_success
from rollart.infra.history import busy_seconds

__all__ = ["compare_runs", "plot_run"]

POOL_ORDER = ["cpu", "h800", "h20", "serverless", "trainer"]


def _read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_run(run_dir: Path) -> list[Path]:
    """Write learning.png (reward/success vs step and vs wall time) and timeline.png; return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    metrics = _read_jsonl(run_dir / "metrics.jsonl")
    if not metrics:
        raise FileNotFoundError(f"{run_dir / 'metrics.jsonl'} is missing or empty: is this a `rollart train` run dir?")
    written = [_plot_learning(metrics, run_dir / "learning.png")]
    timeline = _read_jsonl(run_dir / "timeline.jsonl")
    if timeline:
        written.append(_plot_timeline(timeline, run_dir / "timeline.png"))
    return written


def compare_runs(run_dirs: list[Path], labels: list[str], out: Path, smooth: int = 5) -> Path:
    """One PNG: success (moving average over `smooth` steps) of several runs vs step and vs wall time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for i, (run_dir, label) in enumerate(zip(run_dirs, labels)):
        rows = _read_jsonl(run_dir / "metrics.jsonl")
        if not rows:
            raise FileNotFoundError(f"{run_dir / 'metrics.jsonl'} is missing or empty: is this a `rollart train` run dir?")
        success = _moving_mean([played_success(r) for r in rows], smooth)
        axes[0].plot([r["step"] for r in rows], success, color=f"C{i}", label=label)
        axes[1].plot([r["elapsed_s"] / 60 for r in rows], success, color=f"C{i}", label=label)
    for ax, xlabel in ((axes[0], "train step"), (axes[1], "wall time (min)")):
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"success rate ({smooth}-step mean)")
    axes[0].legend(loc="upper left")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _moving_mean(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def _plot_learning(rows: list[dict], out: Path) -> Path:
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    minutes = [r["elapsed_s"] / 60 for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for ax, xs, label in ((axes[0], steps, "train step"), (axes[1], minutes, "wall time (min)")):
        ax.plot(xs, [r["reward_mean"] for r in rows], label="reward", color="tab:blue")
        ax.plot(xs, [played_success(r) for r in rows], label="success", color="tab:green")
        tasks = sorted({t for r in rows for t in r.get("task_success", {})})
        if len(tasks) > 1:
            for t in tasks:
                ax.plot(xs, [r["task_success"].get(t, float("nan")) for r in rows], "--", label=f"success: {t}")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("batch mean")
    axes[0].legend(loc="upper left")
    last = rows[-1]
    fig.suptitle(f"{out.parent.name}: {len(rows)} steps, staleness mean {last['staleness_mean']:.2f}, "
                 f"dropped {last['dropped']}, " + (f"filtered {last['filtered']}, " if last.get("filtered") else "")
                 + f"failed {last['failed']}")  # fmt: skip
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _plot_timeline(rows: list[dict], out: Path) -> Path:
    import matplotlib.pyplot as plt

    t0 = min(r["start"] for r in rows)
    t1 = max(r["end"] for r in rows)
    pools = [p for p in POOL_ORDER if any(r["pool"] == p for r in rows)]
    pools += sorted({r["pool"] for r in rows} - set(pools))
    fig, ax = plt.subplots(figsize=(12, 0.6 + 0.55 * len(pools)))
    for y, pool in enumerate(pools):
        spans = [(r["start"] - t0, r["end"] - t0) for r in rows if r["pool"] == pool]
        busy = busy_seconds(spans)
        ax.broken_barh([(s, max(e - s, 1e-3)) for s, e in spans], (y - 0.35, 0.7), color=f"C{y}", alpha=0.6)
        ax.text(t1 - t0, y, f" busy {busy / max(t1 - t0, 1e-9):.0%}", va="center")
    ax.set_yticks(range(len(pools)), pools)
    ax.set_xlabel("seconds since the first activity")
    ax.set_title("rollout timeline: when each pool had at least one activity running")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
