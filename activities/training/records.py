"""A run dir's trainer files: step records (what makes `train_step` idempotent) and the checkpoint root.

A step's record is written last, atomically, after its weights are published and its checkpoint
(if any) is complete: it is the step's commit point. Whoever sees a record knows the step is done
and what it returned; a retried step returns it instead of training twice.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from rollart.contracts.activities import TrainStepResult

__all__ = ["checkpoint_dir", "last_recorded_step", "read_record", "step_record_path", "write_record"]


def checkpoint_dir(run_dir: str | Path) -> Path:
    """Where a run's trainer checkpoints live."""
    return Path(run_dir) / "checkpoints"


def step_record_path(run_dir: str | Path, step: int) -> Path:
    """Where the result of train step `step` is recorded (the idempotency record)."""
    return Path(run_dir) / "steps" / f"{step:06d}.json"


def read_record(run_dir: str | Path, step: int) -> TrainStepResult | None:
    """The recorded result of step `step`, or None if it never completed."""
    try:
        return TrainStepResult.model_validate_json(step_record_path(run_dir, step).read_bytes())
    except FileNotFoundError:
        return None


def write_record(run_dir: str | Path, result: TrainStepResult) -> None:
    """Atomically write the step's record (temp file + rename): it is the commit point of the step."""
    path = step_record_path(run_dir, result.step)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(result.model_dump_json().encode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def last_recorded_step(run_dir: str | Path, after: int) -> int:
    """The last step of the unbroken run of records after step `after` (`after` itself if there is none)."""
    step = after
    while step_record_path(run_dir, step + 1).is_file():
        step += 1
    return step
