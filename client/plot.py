"""`rollart plot RUN_DIR`: learning curves and the rollout timeline as PNGs, from the run dir's files."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollart.contracts.training import played_success
from rollart.infra.temporal.history import busy_seconds
from rollart.spec.pools import DEFAULT_POOLS, ROLES

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "compare_runs",
    "learning_figure",
    "plot_run",
    "png_bytes",
    "read_jsonl",
    "timeline_figure",
    "timeline_pools",
    "train_figure",
]

_ROLE_ORDER = ("env", "generation", "reward", "trainer", "control")
"""The timeline's rows, top to bottom: the way a trajectory goes (reset, generate, reward), then the trainer."""

# The trainer's scalars `train_figure` draws, in this order, when a run has them (`train` of a step record).
TRAIN_METRICS = (
    "loss",
    "entropy",
    "action_entropy",
    "entropy_coef",
    "kl",
    "grad_norm",
    "clip_frac",
    "lr",
    "is_truncated_frac",
    "adv_abs_mean",
)


def read_jsonl(path: Path) -> list[dict]:
    """The rows of a run dir's JSON-lines file; none when it is missing. A last line cut short (a client that
    died mid-write) is left out, as `MetricsWriter` leaves it out when it continues the file."""
    if not path.exists():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    rows = [json.loads(line) for line in lines[:-1]]
    try:
        rows += [json.loads(line) for line in lines[-1:]]
    except json.JSONDecodeError:
        pass
    return rows


def _pyplot() -> Any:
    """pyplot on the Agg backend: the plots are files, never windows (and need no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_run(run_dir: Path) -> list[Path]:
    """Write learning.png (reward/success vs step and vs wall time) and timeline.png; return their paths."""
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    if not metrics:
        raise FileNotFoundError(f"{run_dir / 'metrics.jsonl'} is missing or empty: is this a `rollart train` run dir?")
    written = [_save(learning_figure(metrics, run_dir.name), run_dir / "learning.png")]
    timeline = read_jsonl(run_dir / "timeline.jsonl")
    if timeline:
        written.append(_save(timeline_figure(timeline), run_dir / "timeline.png"))
    return written


def compare_runs(run_dirs: list[Path], labels: list[str], out: Path, smooth: int = 5) -> Path:
    """One PNG: success (moving average over `smooth` steps) of several runs vs step and vs wall time."""
    fig, axes = _pyplot().subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for i, (run_dir, label) in enumerate(zip(run_dirs, labels)):
        rows = read_jsonl(run_dir / "metrics.jsonl")
        if not rows:
            raise FileNotFoundError(
                f"{run_dir / 'metrics.jsonl'} is missing or empty: is this a `rollart train` run dir?"
            )
        success = _moving_mean([played_success(r) for r in rows], smooth)
        axes[0].plot([r["step"] for r in rows], success, color=f"C{i}", label=label)
        axes[1].plot([r["elapsed_s"] / 60 for r in rows], success, color=f"C{i}", label=label)
    for ax, xlabel in ((axes[0], "train step"), (axes[1], "wall time (min)")):
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"success rate ({smooth}-step mean)")
    axes[0].legend(loc="upper left")
    out.parent.mkdir(parents=True, exist_ok=True)
    return _save(fig, out)


def _save(fig: Figure, out: Path) -> Path:
    """The figure as a PNG at `out`, then closed (pyplot keeps every open figure alive)."""
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    _pyplot().close(fig)
    return out


def png_bytes(fig: Figure, dpi: int = 90) -> bytes:
    """The figure as PNG bytes, then closed: for a page that carries its images inline."""
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=dpi)
    _pyplot().close(fig)
    return buf.getvalue()


def _moving_mean(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def learning_figure(rows: list[dict], name: str) -> Figure:
    """Reward and success (each task's too, when there are several) vs step and vs wall time; the ledger on top."""
    plt = _pyplot()
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
    fig.suptitle(
        f"{name}: {len(rows)} steps, staleness mean {last['staleness_mean']:.2f}, "
        f"dropped {last['dropped']}, "
        + (f"filtered {last['filtered']}, " if last.get("filtered") else "")
        + f"failed {last['failed']}"
    )
    return fig


def timeline_pools(rows: list[dict]) -> list[tuple[str, str | None]]:
    """The timeline's pools with their roles, in the order they are drawn: by role (`_ROLE_ORDER`), the defaults
    in their own order within one (cpu, h800, h20), then by name.

    A row's role is the one the job declared (`timeline.jsonl` records it); a run dir from before roles were
    recorded takes the default pools' roles.
    """
    roles: dict[str, str | None] = {}
    for r in rows:
        default = DEFAULT_POOLS.get(r["pool"])
        roles.setdefault(r["pool"], r.get("role") or (default.role if default else None))
    defaults = list(DEFAULT_POOLS)

    def key(pool: str) -> tuple[int, int, str]:
        role = roles[pool]
        by_role = _ROLE_ORDER.index(role) if role in ROLES else len(_ROLE_ORDER)
        return by_role, defaults.index(pool) if pool in defaults else len(defaults), pool

    return [(pool, roles[pool]) for pool in sorted(roles, key=key)]


def timeline_figure(rows: list[dict]) -> Figure:
    """One bar per pool: when it had at least one activity running, and its busy share of the whole run."""
    plt = _pyplot()
    t0 = min(r["start"] for r in rows)
    t1 = max(r["end"] for r in rows)
    drawn = timeline_pools(rows)
    pools = [pool for pool, _ in drawn]
    fig, ax = plt.subplots(figsize=(12, 0.6 + 0.55 * len(pools)))
    for y, pool in enumerate(pools):
        spans = [(r["start"] - t0, r["end"] - t0) for r in rows if r["pool"] == pool]
        busy = busy_seconds(spans)
        ax.broken_barh([(s, max(e - s, 1e-3)) for s, e in spans], (y - 0.35, 0.7), color=f"C{y}", alpha=0.6)
        ax.text(t1 - t0, y, f" busy {busy / max(t1 - t0, 1e-9):.0%}", va="center")
    ax.set_yticks(range(len(pools)), [f"{pool} ({role})" if role else pool for pool, role in drawn])
    ax.set_xlabel("seconds since the first activity")
    ax.set_title("rollout timeline: when each pool had at least one activity running")
    return fig


def train_figure(rows: list[dict]) -> Figure | None:
    """The trainer's scalars (loss, entropy, KL, grad norm, ...) vs step, one small panel each; None when the rows
    carry none of them (a run of stand-in activities)."""
    names = [m for m in TRAIN_METRICS if any(isinstance(r.get("train", {}).get(m), (int, float)) for r in rows)]
    if not names:
        return None
    cols = min(4, len(names))
    nrows = -(-len(names) // cols)
    fig, axes = _pyplot().subplots(nrows, cols, figsize=(12, 2.6 * nrows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        points = [(r["step"], r["train"][name]) for r in rows if isinstance(r.get("train", {}).get(name), (int, float))]
        ax.plot([s for s, _ in points], [v for _, v in points], color="tab:purple")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("train step", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    return fig
