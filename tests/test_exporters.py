"""Metric exporters: metrics.jsonl's rows in TensorBoard event files (read back with TensorBoard's own reader),
once per step across re-attached clients; W&B offline; the job spec's `metrics` section."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rollart.client.exporters import ExporterUnavailable, TensorBoardExporter, check_installed, flatten, open_exporters
from rollart.client.train import MetricsWriter
from rollart.contracts.training import StepRecord
from rollart.spec.config import JobSpec, JobSpecError, MetricsConfig, load_job
from tests.support.tasks import frozenlake_task


def _record(step: int) -> StepRecord:
    """A step as the training workflow reports it: two tasks, the ledger, the trainer's metrics."""
    return StepRecord(
        step=step,
        version=step + 1,
        time=1_700_000_000.0 + 10 * step,
        samples=8,
        reward_mean=0.25 * step,
        success_rate=0.5,
        success_sampled=None,
        task_success={"frozenlake": 0.5, "arithmetic": 0.125 * step},
        staleness_mean=0.5,
        staleness_max=1,
        completion_tokens=1000,
        started=16,
        trained=8,
        dropped=1,
        failed=0,
        in_flight=7,
        buffered=0,
        filtered=0,
        train={"loss": 1.0 - 0.1 * step, "entropy": 0.7, "lr": 1e-5, "grad_norm": 2.0, "clip_frac": 0.0},
    )


def _scalars(log_dir: Path) -> EventAccumulator:
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})  # 0: keep every event
    events.Reload()
    return events


def test_flatten_makes_tag_paths_and_leaves_out_what_is_not_a_scalar() -> None:
    flat = flatten({**_record(2).model_dump(), "elapsed_s": 20.0, "tokens_per_s": 100.0})
    assert flat["train/loss"] == pytest.approx(0.8) and flat["train/clip_frac"] == 0.0
    assert flat["task_success/arithmetic"] == 0.25 and flat["task_success/frozenlake"] == 0.5
    assert flat["ledger/trained"] == 8.0 and flat["ledger/in_flight"] == 7.0 and "trained" not in flat
    assert flat["reward_mean"] == 0.5 and flat["tokens_per_s"] == 100.0 and flat["version"] == 3.0
    assert not {"step", "time", "success_sampled"} & flat.keys()  # the global step, an epoch time, a None
    assert flatten({"step": 0, "note": "text", "flag": True, "nested": {"deeper": {"x": 1}}}) == {
        "flag": 1.0,
        "nested/deeper/x": 1.0,
    }


def test_tensorboard_reader_finds_the_scalars_of_every_step(tmp_path: Path) -> None:
    writer = MetricsWriter(tmp_path, [TensorBoardExporter(tmp_path / "tensorboard")])
    rows = writer.write([_record(0), _record(1), _record(2)], started_at=1_700_000_000.0 - 10)
    events = _scalars(tmp_path / "tensorboard")  # flushed on each write: readable before close
    writer.close()
    tags = set(events.Tags()["scalars"])
    assert {
        "train/loss",
        "train/grad_norm",
        "task_success/frozenlake",
        "task_success/arithmetic",
        "ledger/trained",
        "ledger/dropped",
        "reward_mean",
        "success_rate",
        "tokens_per_s",
        "trajectories_per_s",
    } <= tags
    loss = events.Scalars("train/loss")
    assert [e.step for e in loss] == [0, 1, 2]
    assert [e.value for e in loss] == pytest.approx([1.0, 0.9, 0.8])
    assert [e.value for e in events.Scalars("task_success/arithmetic")] == pytest.approx([0.0, 0.125, 0.25])
    assert [e.value for e in events.Scalars("ledger/trained")] == [8.0, 8.0, 8.0]
    assert [e.value for e in events.Scalars("trajectories_per_s")] == pytest.approx(
        [r["trajectories_per_s"] for r in rows]
    )


def test_a_reattached_client_exports_each_step_once(tmp_path: Path) -> None:
    first = MetricsWriter(tmp_path, [TensorBoardExporter(tmp_path / "tensorboard")])
    first.write([_record(0), _record(1)], started_at=1_700_000_000.0)
    first.close()
    again = MetricsWriter(tmp_path, [TensorBoardExporter(tmp_path / "tensorboard")])
    again.write([_record(0), _record(1), _record(2), _record(3)], started_at=1_700_000_000.0)  # the whole history
    again.write([_record(3)], started_at=1_700_000_000.0)  # a poll with nothing new writes nothing
    again.close()
    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 2
    assert [e.step for e in _scalars(tmp_path / "tensorboard").Scalars("train/loss")] == [0, 1, 2, 3]


def test_the_metrics_section_defaults_to_tensorboard_only(tmp_path: Path) -> None:
    job = JobSpec(tasks=[frozenlake_task()])
    assert job.metrics.tensorboard and not job.metrics.wandb.enabled and job.metrics.wandb.mode == "offline"
    exporters = open_exporters(job, "job-1", tmp_path)
    assert [type(e).__name__ for e in exporters] == ["TensorBoardExporter"]
    for e in exporters:
        e.close()
    off = JobSpec(tasks=[frozenlake_task()], metrics={"tensorboard": False, "wandb": False})
    assert open_exporters(off, "job-1", tmp_path) == []
    assert JobSpec(tasks=[frozenlake_task()], metrics={"wandb": True}).metrics.wandb.enabled


def test_a_bad_metrics_section_is_a_readable_error(tmp_path: Path) -> None:
    spec = tmp_path / "job.json"
    spec.write_text(
        json.dumps(
            {
                "tasks": [frozenlake_task().model_dump(mode="json")],
                "metrics": {"tensorbord": True, "wandb": {"enabled": True, "mode": "cloud"}},
            }
        )
    )
    with pytest.raises(JobSpecError) as err:
        load_job(spec)
    message = str(err.value)
    assert f"{spec}: invalid job spec (2 problems)" in message
    assert "metrics.tensorbord: Extra inputs are not permitted" in message
    assert "metrics.wandb.mode: Input should be 'offline' or 'online' (got 'cloud')" in message


def test_wandb_enabled_but_missing_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ExporterUnavailable, match=r"pip install wandb"):
        check_installed(MetricsConfig(wandb={"enabled": True}))
    check_installed(MetricsConfig())  # off: nothing to install


@pytest.mark.integration  # wandb.init starts its service process (wandb-core)
@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb is not installed (pip install wandb)")
def test_wandb_offline_run_holds_the_config_and_history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path),
        "WANDB_SILENT": "true",
        "WANDB_CONFIG_DIR": str(tmp_path / "config"),
        "WANDB_CACHE_DIR": str(tmp_path / "cache"),
    }.items():
        monkeypatch.setenv(key, value)
    job = JobSpec(tasks=[frozenlake_task()], metrics={"tensorboard": False, "wandb": {"enabled": True}})
    (exporter,) = open_exporters(job, "job-wandb-1", tmp_path)
    writer = MetricsWriter(tmp_path, [exporter])
    try:
        writer.write([_record(0), _record(1)], started_at=1_700_000_000.0)
        run = exporter._run  # the test reads back what the run got
        assert run.offline and run.id == "job-wandb-1" and run.name == "job-wandb-1"
        assert run.config["name"] == "job" and run.config["metrics"]["wandb"]["enabled"] is True
        assert run.summary["train/loss"] == pytest.approx(0.9) and run.summary["ledger/trained"] == 8
        run_dir = exporter.run_dir
    finally:
        writer.close()
    assert run_dir.parent == tmp_path / "wandb" and run_dir.name.startswith("offline-run-")
    history = list(run_dir.glob("*.wandb"))
    assert len(history) == 1 and history[0].stat().st_size > 0
