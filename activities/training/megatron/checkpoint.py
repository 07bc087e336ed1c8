"""Sharded megatron checkpoints: each tensor-parallel rank's model shard and optimizer state in its own file.

Layout under the run's checkpoint root (as the torch backend's, so `latest_checkpoint` finds both):

  step-000019/model-tp00.pt  optim-tp00.pt  model-tp01.pt  optim-tp01.pt  ...  meta.json

Data-parallel replicas are identical, so only data-parallel group 0 writes. The files go into a
temporary directory that the leader renames into place after every writer is done (a barrier):
a reader sees a whole checkpoint or none. `meta.json` records the tensor-parallel size; resuming
with another size is refused (the shards would not fit) with what to do instead.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from rollart.activities.rl.weights_io import latest_checkpoint, prune_checkpoints

__all__ = ["TensorParallelMismatch", "load_sharded", "save_sharded"]

log = logging.getLogger(__name__)


class TensorParallelMismatch(ValueError):
    """The newest checkpoint was written with another tensor-parallel size."""


def _broadcast(obj: object) -> object:
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def save_sharded(root: Path, step: int, model_state: dict, optim_state: dict, *, tensor: int, keep: int = 2) -> Path:
    """Write this rank's shard of the checkpoint after train step `step` (a collective of every rank)."""
    from megatron.core import parallel_state as ps

    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = Path(str(_broadcast(tempfile.mkdtemp(prefix=".tmp-", dir=root) if dist.get_rank() == 0 else None)))
    try:
        if ps.get_data_parallel_rank() == 0:
            r = ps.get_tensor_model_parallel_rank()
            torch.save({k: v.cpu() for k, v in model_state.items()}, tmp / f"model-tp{r:02d}.pt")
            torch.save(optim_state, tmp / f"optim-tp{r:02d}.pt")
        dist.barrier()
        if dist.get_rank() == 0:
            (tmp / "meta.json").write_text(
                json.dumps({"step": step, "version": step + 1, "backend": "megatron", "tensor": tensor})
            )
            if final.exists():  # re-checkpointing the same step: move the old one aside first
                old = root / f".old-{final.name}-{os.getpid()}"
                os.rename(final, old)
                shutil.rmtree(old, ignore_errors=True)
            os.rename(tmp, final)
            prune_checkpoints(root, keep)
            log.info("checkpoint of step %d written to %s (%d tensor-parallel shards)", step, final, tensor)
    except BaseException:
        if dist.get_rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    dist.barrier()
    return final


def load_sharded(root: Path, *, tensor: int) -> tuple[int, dict, dict] | None:
    """(step, this rank's model shard, its optimizer state) of the newest checkpoint under `root`, or None."""
    from megatron.core import parallel_state as ps

    path = latest_checkpoint(root)
    if path is None:
        return None
    meta = json.loads((path / "meta.json").read_text())
    if meta.get("backend") != "megatron":
        raise TensorParallelMismatch(
            f"checkpoint {path} was written by the {meta.get('backend', 'torch')} backend; resume it with that "
            "backend, "
            "or start a new run dir"
        )
    if meta["tensor"] != tensor:
        raise TensorParallelMismatch(
            f"checkpoint {path} holds {meta['tensor']} tensor-parallel shards but the trainer runs tensor={tensor}: "
            f"resume with trainer.parallel.tensor: {meta['tensor']} (data parallelism may change), or start a new run "
            "dir"
        )
    r = ps.get_tensor_model_parallel_rank()
    model_state = torch.load(path / f"model-tp{r:02d}.pt", weights_only=True)
    optim_state = torch.load(path / f"optim-tp{r:02d}.pt", weights_only=True)
    log.info("resumed from checkpoint %s (step %d, shard %d of %d)", path, meta["step"], r, tensor)
    return int(meta["step"]), model_state, optim_state
