"""Sharded megatron checkpoints: each tensor-parallel rank's model shard and optimizer state in its own file.

Layout under the run's checkpoint root (as the torch backend's, so `latest_checkpoint` finds both):

  step-000019/model-tp00.pt  optim-tp00.pt  model-tp01.pt  optim-tp01.pt  ...  meta.json

With expert parallelism (MoE, `parallel.expert` X > 1) each expert-parallel rank x holds other experts, so
the files are `model-tp00-ep{x}.pt` / `optim-tp00-ep{x}.pt`, written by the expert-parallel ranks of
expert-data-parallel rank 0 (each holds the dense tensors too: resuming needs nothing else).

Data-parallel replicas are identical, so only data-parallel group 0 writes. The files go into a
temporary directory that the leader renames into place after every writer is done (a barrier):
a reader sees a whole checkpoint or none. `meta.json` records the tensor- and expert-parallel sizes;
resuming with other sizes is refused (the shards would not fit) with what to do instead.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
import torch.distributed as dist

from rollart.activities.rl.weights_io import latest_checkpoint
from rollart.activities.training.sharded_write import write_sharded

__all__ = ["TensorParallelMismatch", "load_sharded", "save_sharded"]

log = logging.getLogger(__name__)


class TensorParallelMismatch(ValueError):
    """The newest checkpoint was written with another tensor-parallel size."""


def _shard(tensor_rank: int, expert: int) -> str:
    """This rank's file suffix: its tensor-parallel rank, and its expert-parallel rank when experts are split."""
    from megatron.core import parallel_state as ps

    ep = f"-ep{ps.get_expert_model_parallel_rank():02d}" if expert > 1 else ""
    return f"tp{tensor_rank:02d}{ep}"


def _writes() -> bool:
    """Whether this rank writes its shard: one replica of each (tensor, expert) shard."""
    from megatron.core import parallel_state as ps

    if ps.get_expert_model_parallel_world_size() > 1:
        return ps.get_expert_data_parallel_rank() == 0
    return ps.get_data_parallel_rank() == 0


def save_sharded(
    root: Path, step: int, model_state: dict, optim_state: dict, *, tensor: int, expert: int = 1, keep: int = 2
) -> Path:
    """Write this rank's shard of the checkpoint after train step `step` (a collective of every rank)."""
    from megatron.core import parallel_state as ps

    def write(tmp: Path) -> None:
        if _writes():
            shard = _shard(ps.get_tensor_model_parallel_rank(), expert)
            torch.save({k: v.cpu() for k, v in model_state.items()}, tmp / f"model-{shard}.pt")
            torch.save(optim_state, tmp / f"optim-{shard}.pt")

    meta = {"backend": "megatron", "tensor": tensor, "expert": expert}
    final = write_sharded(root, step, meta, write, keep=keep)
    if dist.get_rank() == 0:
        log.info(
            "checkpoint of step %d written to %s (%d tensor- x %d expert-parallel shards)", step, final, tensor, expert
        )
    return final


def load_sharded(root: Path, *, tensor: int, expert: int = 1) -> tuple[int, dict, dict] | None:
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
    if meta.get("expert", 1) != expert:
        raise TensorParallelMismatch(
            f"checkpoint {path} holds {meta.get('expert', 1)} expert-parallel shards but the trainer runs "
            f"expert={expert}: resume with trainer.parallel.expert: {meta.get('expert', 1)}, or start a new run dir"
        )
    r = ps.get_tensor_model_parallel_rank()
    shard = _shard(r, expert)
    model_state = torch.load(path / f"model-{shard}.pt", weights_only=True)
    optim_state = torch.load(path / f"optim-{shard}.pt", weights_only=True)
    log.info("resumed from checkpoint %s (step %d, shard %d of %d)", path, meta["step"], r, tensor)
    return int(meta["step"]), model_state, optim_state
