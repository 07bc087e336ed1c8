"""Metric exporters: each new metrics.jsonl row also goes to TensorBoard event files and, if enabled, W&B.

The training client's `MetricsWriter` hands every exporter the rows it has just written (a re-attached
client only the steps not written before), so an exporter never sees a step twice. Rows are flattened into
scalar tags: nested dicts become paths (`train/loss`, `task_success/frozenlake`), the trajectory counts go
under `ledger/` (`ledger/trained`), and the step is the global step.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from rollart.spec.config import JobSpec, MetricsConfig, WandbConfig

__all__ = [
    "Exporter",
    "ExporterUnavailable",
    "TensorBoardExporter",
    "WandbExporter",
    "check_installed",
    "flatten",
    "open_exporters",
]

LEDGER = ("started", "trained", "dropped", "filtered", "failed", "in_flight", "buffered")
"""A step row's trajectory counts, exported as `ledger/<count>`."""

_NOT_SCALARS = frozenset({"step", "time"})  # the global step itself; an epoch time (float32 would round it)


class ExporterUnavailable(RuntimeError):
    """An exporter is enabled in the job spec but its package is not installed; the message says what to install."""


class Exporter(Protocol):
    """Takes the rows metrics.jsonl has just got (each once, in step order); `close` after the last."""

    def write(self, rows: Sequence[dict]) -> None: ...

    def close(self) -> None: ...


def flatten(row: dict) -> dict[str, float]:
    """A metrics row as scalar tags: numbers and bools kept, nested dicts as `outer/inner`, the trajectory
    counts as `ledger/<count>`; `step`, `time`, None and anything not a number left out."""
    out: dict[str, float] = {}

    def add(tag: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                add(f"{tag}/{k}", v)
        elif isinstance(value, (int, float)):  # bool is an int
            out[tag] = float(value)

    for key, value in row.items():
        if key not in _NOT_SCALARS:
            add(f"ledger/{key}" if key in LEDGER else key, value)
    return out


class TensorBoardExporter:
    """Scalars into event files under `log_dir` (tensorboard's own writer: the client need not import torch).

    Every write is flushed, so `tensorboard --logdir` sees a step as soon client does; a re-attached
    client adds a new event file beside the old ones, with only the steps it writes.
    """

    def __init__(self, log_dir: Path) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = log_dir
        self._writer = EventFileWriter(str(log_dir))

    def write(self, rows: Sequence[dict]) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        for row in rows:
            values = [Summary.Value(tag=tag, simple_value=v) for tag, v in flatten(row).items()]
            self._writer.add_event(Event(wall_time=time.time(), step=row["step"], summary=Summary(value=values)))
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbExporter:
    """A W&B run named and identified by the job id (a re-attached client resumes it), configured with the job
    spec; offline by default, under `run_dir/wandb` (`wandb sync` uploads it later)."""

    def __init__(self, config: WandbConfig, run_dir: Path, job_id: str, job_config: dict[str, Any]) -> None:
        import wandb

        self._run = wandb.init(
            project=config.project,
            entity=config.entity,
            mode=config.mode,
            dir=str(run_dir),
            name=job_id,
            id=job_id,
            resume="allow",
            config=job_config,
        )

    @property
    def run_dir(self) -> Path:
        """The W&B run's own directory (its `files/` and the `.wandb` history file)."""
        return Path(self._run.dir).parent

    def write(self, rows: Sequence[dict]) -> None:
        for row in rows:
            self._run.log(flatten(row), step=row["step"], commit=True)  # at once, not when the next step comes

    def close(self) -> None:
        self._run.finish()


def check_installed(config: MetricsConfig) -> None:
    """Fail before a job starts when an enabled exporter's package is missing."""
    if config.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ExporterUnavailable(
            "metrics.tensorboard is on but tensorboard is not installed: `pip install "
            "tensorboard`, or set `metrics: {tensorboard: false}` in the job spec"
        )
    if config.wandb.enabled and importlib.util.find_spec("wandb") is None:
        raise ExporterUnavailable(
            "metrics.wandb is enabled but wandb is not installed: `pip install wandb` "
            "(or `pip install rollart[wandb]`), or set `metrics: {wandb: false}`"
        )


def open_exporters(job: JobSpec, job_id: str, run_dir: Path) -> list[Exporter]:
    """The exporters the job's `metrics` section enables, writing into `run_dir`."""
    check_installed(job.metrics)
    exporters: list[Exporter] = []
    if job.metrics.tensorboard:
        exporters.append(TensorBoardExporter(run_dir / "tensorboard"))
    if job.metrics.wandb.enabled:
        exporters.append(WandbExporter(job.metrics.wandb, run_dir, job_id, job.model_dump(mode="json")))
    return exporters
