"""Sharded checkpoints of an FSDP2 trainer with torch.distributed.checkpoint: each rank writes its shards.

Layout under the run's checkpoint root (as the other backends', so `latest_checkpoint` finds it):

  step-000019/  __0_0.distcp  __1_0.distcp ...  .metadata  meta.json

DCP records each tensor's global shape and which slice every file holds, so a checkpoint written by N ranks
loads on M (each rank reads the slices its own shards cover): a job can resume with another `fsdp.ranks`.
Model and AdamW state go through `torch.distributed.checkpoint.state_dict` (fully-qualified names, the
optimizer keyed by parameter name). Files go into a temporary directory that the leader renames into place
after every rank wrote (a barrier), so a reader sees a whole checkpoint or none.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from rollart.activities.rl.weights_io import latest_checkpoint
from rollart.activities.training.sharded_write import write_sharded

__all__ = ["BACKEND", "CheckpointMismatch", "load_dcp", "save_dcp"]

log = logging.getLogger(__name__)

BACKEND = "torch-fsdp"
"""`meta.json`'s backend: the plain torch backend's single-file checkpoints cannot be read as these."""


class CheckpointMismatch(ValueError):
    """The newest checkpoint was written by another backend (no restart can load it)."""


def save_dcp(root: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, keep: int = 2) -> Path:
    """Write every rank's shards of model and optimizer after train step `step` (a collective of every rank)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    def write(tmp: Path) -> None:
        model_state, optim_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(tmp))

    ranks = dist.get_world_size()
    final = write_sharded(root, step, {"backend": BACKEND, "ranks": ranks}, write, keep=keep)
    if dist.get_rank() == 0:
        log.info("checkpoint of step %d written to %s (%d ranks)", step, final, ranks)
    return final


def load_dcp(root: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int | None:
    """Load the newest checkpoint under `root` into this rank's shards (any world size wrote it); its step."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = latest_checkpoint(Path(root))
    if path is None:
        return None
    meta: dict[str, Any] = json.loads((path / "meta.json").read_text())
    if meta.get("backend") != BACKEND:
        raise CheckpointMismatch(
            f"checkpoint {path} was written by the {meta.get('backend', 'torch')} backend, not the torch backend "
            "with fsdp; resume it with the trainer section it was written with, or start a new run dir"
        )
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    log.info("resumed from checkpoint %s (step %d, written by %d ranks)", path, meta["step"], meta["ranks"])
    return int(meta["step"])
