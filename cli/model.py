"""The model a job names must be there: only the embedded tiny models (`.rollart/models/tiny`, `tiny-lora`) are ever
built on the fly."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rollart.cli.errors import UserError

if TYPE_CHECKING:
    from rollart.spec.config import JobSpec

__all__ = ["check_model_dir", "ensure_model", "is_default_model"]


def is_default_model(model_dir: Path) -> bool:
    """Whether `model_dir` is an embedded tiny model (`.rollart/models/tiny`, `tiny-lora`, `tiny-chat`), built on
    first use."""
    from rollart.infra.tiny_model import first_use_scale

    return first_use_scale(model_dir) is not None


def check_model_dir(model_dir: Path, source: str) -> None:
    """A model dir other than the default must hold a model: a typo must not silently train a fresh random one."""
    if is_default_model(model_dir) or (model_dir / "config.json").is_file():
        return
    problem = "does not exist" if not model_dir.exists() else "holds no model (no config.json)"
    raise UserError(
        f"{source}: model_dir {model_dir} {problem}; point model_dir at a model directory, or build "
        f"the tiny one there with `rollart init-model --out {model_dir}`"
    )


def ensure_model(job: JobSpec, source: str) -> None:
    """The job's model is there before anything loads it: the default is built (once, here), any other checked."""
    check_model_dir(job.model_dir, source)
    if is_default_model(job.model_dir) and not (job.model_dir / "config.json").exists():
        from rollart.infra.tiny_model import ensure_tiny_model, first_use_options

        print(f"building the tiny model in {job.model_dir} (first use) ...")
        ensure_tiny_model(job.model_dir, **(first_use_options(job.model_dir) or {}))
