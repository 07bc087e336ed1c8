"""LoRA adapters of an FSDP2-sharded peft model: out as peft's files, gathered one tensor at a time, and back in.

peft wraps the model first, then FSDP shards it (frozen base and adapters alike), so each adapter tensor is a
DTensor slice on every rank. Publishing gathers each (`full_tensor`, a collective) and rank 0 alone makes the
files, in the layout `rl.adapter_io.adapter_files` writes for one process; loading cuts each rank's slice out
of the full tensors (no communication).
"""

from __future__ import annotations

import json
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch.distributed.tensor import DTensor, distribute_tensor

from rollart.activities.rl.adapter_io import adapter_state, check_adapter_fits
from rollart.infra.store.adapters import ADAPTER_CONFIG, ADAPTER_WEIGHTS

__all__ = ["load_sharded_adapter", "sharded_adapter_files"]


def sharded_adapter_files(model: Any, leader: bool) -> dict[str, bytes]:
    """The adapter's files on the leader (`rl.adapter_io.adapter_files`' layout), {} on the others; a collective."""
    tensors = {}
    for name, t in adapter_state(model).items():
        full = t.full_tensor() if isinstance(t, DTensor) else t
        if leader:
            tensors[name] = full.detach().to("cpu", torch.float32).contiguous()
    if not leader:
        return {}
    config = {k: sorted(v) if isinstance(v, set) else v for k, v in model.active_peft_config.to_dict().items()}
    config["inference_mode"] = True  # as save_pretrained writes it: a loaded adapter is not trainable by default
    return {
        ADAPTER_CONFIG: json.dumps(config, indent=2, sort_keys=True).encode(),
        ADAPTER_WEIGHTS: st_save(tensors, metadata={"format": "pt"}),
    }


def load_sharded_adapter(model: Any, blob: bytes) -> None:
    """Copy an `adapter_model.safetensors` blob into the sharded adapters in place (optimizer refs survive);
    ValueError when it does not fit (trained with another `trainer.lora`)."""
    tensors = st_load(blob)
    expected = adapter_state(model)
    check_adapter_fits(tensors, expected)
    with torch.no_grad():
        for name, t in expected.items():  # state-dict tensors share the parameters' storage
            full = tensors[name].to(device=t.device, dtype=t.dtype)
            if isinstance(t, DTensor):
                t.copy_(distribute_tensor(full, t.device_mesh, t.placements, src_data_rank=None))
            else:
                t.copy_(full)
