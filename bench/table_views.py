"""The views of `python -m bench tables`: for each benchmark's results files, the rows and columns its tables show.

A view reads results files in the shape their benchmark writes (bench/NAME.py's `main`), so a fresh
`python -m bench NAME` run regenerates its tables; bench/tables.py finds the markers and renders.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["NAME", "VIEWS", "Col", "Row", "View", "fixed", "modes", "pair", "pct", "repeats", "thousands"]


Row = dict[str, Any]


@dataclass(frozen=True)
class Col:
    """One column of a view: its header, the row's key (or a function of the row), how to print the value."""

    header: str
    value: str | Callable[[Row], Any]
    fmt: str | Callable[[Any], str] = ""
    align: str = "r"
    missing: str = "–"
    bold: bool | Callable[[Row], bool] = False

    def cell(self, row: Row) -> str:
        v = self.value(row) if callable(self.value) else row.get(self.value)
        if v is None or (isinstance(v, float) and v != v):
            return self.missing
        text = self.fmt(v) if callable(self.fmt) else (format(v, self.fmt) if self.fmt else str(v))
        bold = self.bold(row) if callable(self.bold) else self.bold
        return f"**{text}**" if bold and text else text


@dataclass(frozen=True)
class View:
    """A table made from results files in a benchmark's own shape: `rows` picks the rows from the loaded files."""

    files: tuple[str, ...]
    rows: Callable[[list[dict[str, Any]]], list[Row]]
    columns: tuple[Col, ...]


# ---------------------------------------------------------------- formats


def pct(v: float) -> str:
    return f"{100 * v:.0f} %"


def pct2(v: float) -> str:
    return f"{100 * v:.2f} %"


def thousands(v: float) -> str:
    return f"{v:,.0f}"


def fixed(digits: int, unit: str = "") -> Callable[[Any], str]:
    return lambda v: f"{v:.{digits}f}{unit}"


def pair(a: str, b: str, fmt: Callable[[Any], str], sep: str = " / ") -> Callable[[Row], str | None]:
    """Two of a row's values in one cell, `a / b`."""

    def cell(row: Row) -> str | None:
        if row.get(a) is None or row.get(b) is None:
            return None
        return f"{fmt(row[a])}{sep}{fmt(row[b])}"

    return cell


def repeats(row: Row) -> str | None:
    walls = row.get("walls_s")
    return ", ".join(f"{w:.1f}" for w in walls) if walls else None


def modes(docs: list[dict[str, Any]]) -> list[Row]:
    return [m for d in docs for m in d["modes"]]


def _key(name: str) -> Callable[[list[dict[str, Any]]], list[Row]]:
    return lambda docs: [r for d in docs for r in d[name]]


# ---------------------------------------------------------------- views, by benchmark

NAME = Col("mode", "name", align="l")

_WEIGHT_TRANSFER = (
    Col("size", "size", align="l"),
    Col("MB", lambda r: r["bytes"] / 1e6, ".1f"),
    Col("backend", "backend", align="l"),
    Col("publish s", "publish_s", ".3f"),
    Col("GB/s", "publish_gbps", ".2f"),
    Col("pull s", "pull_s", ".3f"),
    Col("GB/s", "pull_gbps", ".2f"),
)
_WEIGHT_SWAP = (
    Col("model", "model", align="l"),
    Col("params", lambda r: r["params"] / 1e6, fixed(1, "M")),
    Col("store", "store", align="l"),
    Col("publish s", "publish_s", ".3f"),
    Col("stream + load s", "load_s", ".3f"),
    Col("first request s", "first_request_s", ".3f"),
    Col("total s", "total_s", ".3f"),
)
_SIZE_SWAP = (
    Col("size", "size", align="l"),
    Col("path", "path", align="l"),
    Col("dtype", "dtype", align="l"),
    Col("GB", lambda r: r["bytes"] / 1e9, ".2f"),
    Col("publish s", "publish_s", ".3f"),
    Col("stream + load s", "load_s", ".3f"),
    Col("first request s", "request_s", ".3f"),
    Col("total s", "total_s", ".3f", bold=True),
    Col("× memcpy", "vs_memcpy", ".2f"),
    Col("publisher peak MB", "publisher_peak_mb", ".0f"),
)
_SIZE_FIXED = (
    Col("model", "model", align="l"),
    Col("publish s", "publish_s", ".4f"),
    Col("stream + load s", "load_s", ".4f"),
    Col("first request s", "request_s", ".4f"),
    Col("total s", "total_s", ".4f", bold=True),
    Col("a request alone s", "request_alone_s", ".4f"),
)
_SIZE_TRAIN = (
    Col("size", "size", align="l"),
    Col("trainer", "mode", align="l"),
    Col("step s", "step_s", ".2f", bold=True),
    Col("train s", "train_s", ".2f"),
    Col("publish s", "publish_s", ".2f"),
    Col("publish peak MB (leader)", "publish_peak_mb", ".0f"),
    Col("tokens", "tokens", ".0f"),
)
_SFT = (
    Col("model", "name", align="l"),
    Col("episodes", "episodes"),
    Col("success", "success_rate", ".3f", bold=True),
    Col("first reply calls calc", "first_reply_call_share", ".3f"),
    Col("replies with a parsed call", "tool_call_share", ".3f"),
    Col("unparsed calls", "unparsed_calls"),
    Col("turns", "mean_turns", ".2f"),
    Col("SFT wall min", "sft_min", ".1f"),
)

_LORA_SWAP = (
    Col("model", "model", align="l"),
    Col("published", "kind", align="l"),
    Col("trained params", "trained", thousands),
    Col("MB", lambda r: r["bytes"] / 1e6, ".2f"),
    Col("publish s", "publish_s", ".4f"),
    Col("pull s", "pull_s", ".4f"),
    Col("swap s", "swap_s", ".4f"),
    Col("first request s", "first_request_s", ".4f"),
    Col("total s", "total_s", ".4f"),
    Col("vs full", "speedup_vs_baseline", fixed(1, "x")),
    Col("tokens/s after", "tokens_per_s", thousands),
)
_RESETS = (
    Col("reset_pool_size", "reset_pool_size"),
    Col("resets", "resets", thousands),
    Col("failed", "failed", thousands),
    Col("success", "success_rate", pct2, bold=True),
    Col("activities retried", lambda r: f"{r['resets_retried']:,} ({pct2(r['resets_retried'] / r['resets'])})"),
    Col("p50", "latency_p50_s", fixed(1, " s")),
    Col("p99", "latency_p99_s", fixed(1, " s")),
    Col("resets/s", "resets_per_s", ".0f"),
)


def _trainer(step: str, publish: str) -> tuple[Col, ...]:
    return (
        NAME,
        Col("step s", "wall_s", step),
        Col("vs torch", "speedup_vs_baseline", ".2f"),
        Col("publish s", "publish_s", publish),
        Col("publish vs torch", "publish_vs_baseline", ".2f"),
        Col("first step s", "first_step_s", ".1f"),
    )


_PACKING = (  # bench/trainer_packing.py
    NAME,
    Col("tokens/s", "tokens_per_s", ".0f"),
    Col("vs padded 64", "speedup_vs_baseline", ".2f", bold=True),
    Col("fwd+bwd s", "wall_s", ".2f"),
    Col("loss gap vs padded 64", "loss_gap", ".0e"),
    Col("attention", "attention", align="l"),
)


_LOGPROB_MEMORY = (  # bench/trainer_memory.py
    NAME,
    Col("peak MiB", "peak_mb", ".0f"),
    Col("peak vs today", "peak_vs_baseline", ".2f", bold=True),
    Col("fwd+bwd s", "wall_s", ".1f"),
    Col("mean log-prob", "logp_mean", ".6f"),
    Col("mean entropy", "entropy_mean", ".6f"),
)


_SINGLE_TURN = (
    Col("code", "label", align="l"),
    Col("s/step", "s_per_step", ".2f"),
    Col("activities/step", "activities_per_step", ".3g"),
    Col("generate", "generate_per_step", ".3g"),
    Col("generate_batch", "generate_batch_per_step", ".3g"),
    Col("wave s", "wave_s", ".2f"),
    Col("wave gen s", "wave_generation_s", ".2f"),
    Col("train_step s", "train_step_s", ".2f"),
    Col("server cpu s/step", "cpu_s_temporal-server", ".3f"),
    Col("control cpu s/step", "cpu_s_control", ".3f"),
    Col("h20 cpu s/step", "cpu_s_h20", ".3f"),
)
_REWARD_SERVICE = (
    NAME,
    Col("wall s", "wall_s", ".1f"),
    Col("mean rollout s", "mean_rollout_s", ".1f"),
    Col("traj/s", "trajectories_per_s", ".2f"),
    Col("engine busy", "engine_busy_fraction", pct),
    Col("tokens/s", "tokens_per_s", ".0f"),
    Col("generate ms", "generate_work_ms", ".0f"),
    Col("reward work ms", "reward_work_ms", ".0f"),
    Col("reward wait ms", "reward_wait_ms", ".0f"),
    Col("speedup", "speedup_vs_baseline", fixed(2, "x")),
)
_PRIORITY = (
    Col("engine.priority", "name", align="l"),
    Col("makespan s", "wall_s", ".2f"),
    Col("makespan vs fifo", "speedup_vs_baseline", fixed(2, "x")),
    Col("p50 s", "p50_s", ".2f"),
    Col("p99 s", "p99_s", ".2f"),
    Col("long episodes s", "long_s", ".2f"),
    Col("short episodes s", "short_s", ".2f"),
    Col("preempted", "preempted", ".0f"),
    Col("repeats (makespan s)", repeats, align="l"),
)
_TEMPORAL = (
    Col("unit", "name", align="l"),
    Col("runs", lambda r: len(r["runs"])),
    Col("most of a limit", lambda r: f"{100 * r['max_share']:.1f} %"),
    Col("failed", "failed"),
    Col("unit's events", "events_per_trajectory", ".1f"),
    Col("unit's KB", lambda r: r["bytes_per_trajectory"] / 1000, ".1f"),
    Col("unit's actions", "actions_per_trajectory", ".1f"),
    Col("parent's events", "parent_events_per_trajectory", ".1f"),
    Col("parent's KB", lambda r: r["parent_bytes_per_trajectory"] / 1000, ".1f"),
    Col("parent's actions", "parent_actions_per_trajectory", ".2f"),
)
"""`bench temporal`: per unit, the training workflow's runs, and a trajectory's cost in its unit and its parent."""

_SCALE = (
    Col("trajectories", "n", thousands),
    Col("control procs", "controls"),
    Col("peak running", "peak_in_flight", thousands),
    Col("failed", "failed"),
    Col("ledger", lambda r: "balanced" if r["ledger_balanced"] else "UNBALANCED", align="l"),
    Col("wall s", "wall_s", ".1f"),
    Col("activities/s", "activities_per_s", ".1f"),
    Col("wait p50 / p99 ms", pair("wait_ms_p50", "wait_ms_p99", thousands)),
    Col("wf task p50 / p99 ms", pair("wft_ms_p50", "wft_ms_p99", thousands)),
    Col(
        "events / bytes per traj",
        lambda r: f"{r['events_per_trajectory']:.0f} / {r['bytes_per_trajectory'] / 1000:.1f} KB",
    ),
    Col(
        "server / control / stand-in cores",
        lambda r: f"{r['cores_server']:.2f} / {r['cores_control']:.2f} / {r['cores_standins']:.2f}",
        align="l",
    ),
)


def _learning(docs: list[dict[str, Any]]) -> list[Row]:
    """`bench learning` files: every run (as run: bound, then seed), then each file's medians per bound."""
    runs = [r for d in docs for r in d["runs"]]
    return [*runs, *(s for d in docs for s in d.get("summary", []))]


_LEARNING = (
    Col("bound", "bound"),
    Col("seed", "seed", align="l", bold=lambda r: isinstance(r["seed"], str)),  # "median of 3": the summary
    Col("steps to 0.8", lambda r: r["steps_to_target"] if r["steps_to_target"] is not None else "not reached"),
    Col("min to 0.8", "minutes_to_target", ".1f"),
    Col("last 20 % ≥ 0.8", "stable_share", pct),
    Col("last 50", "last50", ".2f"),
    Col("last 100", "last100", ".2f"),
    Col("greedy eval", "eval", ".3f"),
    Col("run", "minutes", fixed(1, " min")),
)

_CHECK = (  # `bench learning --check` ends a run once it reached the target: no stability columns
    Col("seed", "seed", align="l"),
    Col("steps to 0.8", lambda r: r["steps_to_target"] if r["steps_to_target"] is not None else "not reached"),
    Col("min to 0.8", "minutes_to_target", ".1f"),
    Col("greedy eval", "eval", ".3f"),
    Col("dropped", "dropped"),
    Col("run", "minutes", fixed(1, " min")),
)

_TO_QUALITY = (
    Col("mode", "name", align="l"),
    Col("runs", "runs"),
    Col("reach 0.8", "reached_share", pct),
    Col("steps to 0.8 (each run)", lambda r: ", ".join(str(x) if x else "–" for x in r["each"]), align="l"),
    Col("median steps", "steps_to_target", ".0f"),
    Col("median min to 0.8", "minutes_to_target", ".2f"),
    Col("vs sync (time to 0.8)", "vs_sync", fixed(2, "x")),
    Col("s / step", "s_per_step", ".2f"),
)


def _standin(docs: list[dict[str, Any]]) -> list[Row]:
    """`bench learning_standin` files: per file and bound, the share reaching 0.8 by step 112, the median steps to
    it, and the runs that fell back (their 5-step mean success under 0.5 again after reaching 0.8)."""
    rows = []
    for d in docs:
        for bound in sorted({r["bound"] for r in d["runs"]}):
            runs = [r for r in d["runs"] if r["bound"] == bound]
            hit = [
                r["steps_to_target"] for r in runs if r["steps_to_target"] is not None and r["steps_to_target"] <= 112
            ]
            rows.append(
                {
                    "recipe": ", ".join(d["sets"]) or "the example as it is",
                    "bound": bound,
                    "reached": f"{len(hit)} of {len(runs)}",
                    "median": statistics.median(hit) if hit else None,
                    "fell_back": sum(_fell_back(r["curve"], r["steps_to_target"]) for r in runs),
                }
            )
    return rows


def _fell_back(curve: list[float], reached: int | None, window: int = 5) -> bool:
    if reached is None:
        return False
    means = [statistics.fmean(curve[i - window + 1 : i + 1]) for i in range(reached + 1, len(curve))]
    return any(m < 0.5 for m in means)


_STANDIN = (
    Col("recipe over examples/frozenlake.yaml", "recipe", align="l"),
    Col("bound", "bound"),
    Col("reach 0.8 by step 112", "reached"),
    Col("median steps to 0.8", "median", "g"),
    Col("fell back after reaching", "fell_back"),
)

VIEWS: dict[str, View] = {
    "weight_sync.transfer": View(("weight_sync",), _key("transfer"), _WEIGHT_TRANSFER),
    "weight_sync.swap": View(("weight_sync",), _key("swap"), _WEIGHT_SWAP),
    "lora_swap": View(("lora_swap",), modes, _LORA_SWAP),
    "sft": View(("sft",), modes, _SFT),
    "resets": View(("resets",), _key("rows"), _RESETS),
    "size.swap": View(("size",), _key("swap"), _SIZE_SWAP),
    "size.fixed": View(("size",), _key("fixed"), _SIZE_FIXED),
    "size.train": View(("size",), _key("train"), _SIZE_TRAIN),
    "trainer": View(("trainer",), modes, _trainer(".3f", ".4f")),
    "trainer-h512-l8": View(("trainer-h512-l8",), modes, _trainer(".2f", ".3f")),
    "trainer_packing": View(("trainer_packing",), modes, _PACKING),
    "trainer_packing-h256-l4": View(("trainer_packing-h256-l4",), modes, _PACKING),
    "trainer_memory": View(("trainer_memory",), modes, _LOGPROB_MEMORY),
    "single_turn": View(("single_turn-before", "single_turn-after"), modes, _SINGLE_TURN),
    "reward_service": View(("reward_service",), modes, _REWARD_SERVICE),
    "reward_service-heavy": View(("reward_service-heavy",), modes, _REWARD_SERVICE),
    "scale": View(("scale",), modes, _SCALE),
    "temporal": View(("temporal",), modes, _TEMPORAL),
    "priority": View(("priority",), modes, _PRIORITY),
    "learning.frozenlake-explore": View(
        (
            "learning-frozenlake-explore-b2-s01",
            "learning-frozenlake-cov003-dr-unsolved-s2",
            "learning-frozenlake-explore-b10-s0",
            "learning-frozenlake-explore-b10-s1",
        ),
        lambda docs: sorted(
            (r for d in docs for r in d["runs"]), key=lambda r: (-r["bound"], r["seed"])
        ),  # bound 2 first, as the page reads
        _LEARNING,
    ),
    "learning.frozenlake-b10": View(("learning-frozenlake-b10-s012",), _learning, _LEARNING),
    "learning.check": View(("learning-check",), _key("runs"), _CHECK),
    "learning.standin-farthest": View(("learning-standin-farthest",), _standin, _STANDIN),
    "to_quality": View(("to_quality",), modes, _TO_QUALITY),
    "learning.frozenlake-lora": View(("learning-frozenlake-lora",), _learning, _LEARNING),
    "learning.arithmetic-coverage": View(
        ("learning-arithmetic-coverage-b1", "learning-arithmetic-coverage-b0"), _learning, _LEARNING
    ),
}
"""Tables read from results files in the shape their benchmark writes (bench/NAME.py's `main`)."""
