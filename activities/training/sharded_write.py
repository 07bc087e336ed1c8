"""Writing a checkpoint that several ranks share, whole or not at all: the FSDP and megatron backends' commit.

Every rank writes its files into one temporary directory under the checkpoint root (the leader makes it and
tells the others its name); after a barrier the leader adds `meta.json` and renames the directory into
place (`replace_checkpoint`), so a reader sees a whole checkpoint or none, then prunes the old ones. If any
rank's write fails on the leader, the leader removes the directory.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

from rollart.activities.rl.weights_io import prune_checkpoints, replace_checkpoint

__all__ = ["write_sharded"]


def _from_leader(obj: object) -> object:
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def write_sharded(root: Path, step: int, meta: dict, write: Callable[[Path], None], *, keep: int = 2) -> Path:
    """`write(tmp)` on every rank (its own files), then the leader commits them as step `step`'s checkpoint with
    `meta` (its step and version added) and keeps the newest `keep`; a collective of every rank. Its path."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    leader = dist.get_rank() == 0
    tmp = Path(str(_from_leader(tempfile.mkdtemp(prefix=".tmp-", dir=root) if leader else None)))
    try:
        write(tmp)
        dist.barrier()
        if leader:
            (tmp / "meta.json").write_text(json.dumps({"step": step, "version": step + 1, **meta}))
            replace_checkpoint(tmp, final)
            prune_checkpoints(root, keep)
    except BaseException:
        if leader:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    dist.barrier()
    return final
