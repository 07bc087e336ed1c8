"""A transformers model's tensors under the names its checkpoint on disk gives them, and back.

Why: transformers 5 holds some weights in memory in another layout than its checkpoints. A Qwen3-MoE, a
Mixtral or a Qwen2-MoE keeps each layer's experts fused (`mlp.experts.gate_up_proj` `[E, 2I, H]`), while its
safetensors (what `save_pretrained` writes, vLLM loads and an engine's weight check compares with) hold one
tensor per expert and projection (`mlp.experts.3.up_proj.weight`). A trainer publishes, and engines and
trainers load, the checkpoint's layout; transformers' own reverse conversion (`revert_weight_conversion`, what
`save_pretrained` runs) maps one in-memory tensor to its checkpoint tensors, so a version streams a tensor at a
time. The way back reuses it: the conversion is a pure rearrangement, so reverting a tensor of flat indices
tells where each checkpoint element sits in memory.

A model without such conversions (every dense family here) keeps its names; nothing is copied.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch

__all__ = ["Placement", "assemble", "checkpoint_tensors", "copy_placed", "placements"]

_CONVERTS: weakref.WeakKeyDictionary[torch.nn.Module, bool] = weakref.WeakKeyDictionary()


def _converts(model: torch.nn.Module) -> bool:
    """Whether transformers lays some of `model`'s tensors out otherwise in memory than on disk (cached)."""
    known = _CONVERTS.get(model)
    if known is None:
        known = _CONVERTS[model] = _has_conversions(model)
    return known


def _has_conversions(model: torch.nn.Module) -> bool:
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):  # a peft wrapper publishes its adapter, not these tensors
        return False
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter

    conversions = getattr(model, "_weight_conversions", None) or get_model_conversion_mapping(model, add_legacy=False)
    return any(isinstance(c, WeightConverter) for c in conversions)


def _revert(model: torch.nn.Module, name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
    from transformers.core_model_loading import revert_weight_conversion

    return revert_weight_conversion(model, {name: tensor})


def checkpoint_tensors(
    model: torch.nn.Module, tensors: Iterable[tuple[str, torch.Tensor]]
) -> Iterator[tuple[str, torch.Tensor]]:
    """`tensors` (the model's own, by state-dict name) as its checkpoint holds them, one in-memory tensor at a
    time: a fused expert tensor comes out as one tensor per expert and projection."""
    if not _converts(model):
        yield from tensors
        return
    for name, tensor in tensors:
        yield from _revert(model, name, tensor.detach()).items()


@dataclass(frozen=True)
class Placement:
    """Where a checkpoint tensor goes: the in-memory tensor `name`, whole (`index` None) or at the flat
    positions `index` (its shape is the checkpoint tensor's)."""

    name: str
    index: torch.Tensor | None = None


def placements(model: torch.nn.Module, shapes: Mapping[str, torch.Size]) -> dict[str, Placement]:
    """Each checkpoint name of the in-memory tensors `shapes` (name → shape), and where it goes. A converted
    tensor's index costs 4 bytes an element (8 past 2**31 elements): `assemble` asks for one tensor at a time."""
    if not _converts(model):
        return {name: Placement(name) for name in shapes}
    out: dict[str, Placement] = {}
    for name, shape in shapes.items():
        numel = torch.Size(shape).numel()
        flat = torch.arange(numel, dtype=torch.int32 if numel < 2**31 else torch.int64).view(shape)
        for disk, index in _revert(model, name, flat).items():
            whole = disk == name and torch.equal(index, flat)
            out[disk] = Placement(name, None if whole else index)
    return out


def copy_placed(target: torch.Tensor, placement: Placement, value: torch.Tensor, disk_name: str) -> None:
    """Copy the checkpoint tensor `value` (named `disk_name`) into `target`, the in-memory tensor it belongs to."""
    expected = target.shape if placement.index is None else placement.index.shape
    if value.shape != expected:
        raise ValueError(f"weights tensor {disk_name!r} has shape {tuple(value.shape)}, the model's {tuple(expected)}")
    if placement.index is None:
        target.copy_(value)
    else:
        target.view(-1)[placement.index.view(-1).to(target.device)] = value.reshape(-1).to(target)


def assemble(
    model: torch.nn.Module, shapes: Mapping[str, torch.Size], tensors: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Checkpoint `tensors` as the in-memory tensors `shapes` names: unchanged for a model without conversions,
    else each converted in-memory tensor built from its pieces, one at a time; a name that is no piece passes as
    it is (the caller judges it). Raises ValueError naming the pieces that are missing."""
    if not _converts(model):
        return dict(tensors)
    out, missing = dict(tensors), []
    for name, shape in shapes.items():
        where = placements(model, {name: shape})
        if list(where) == [name] and where[name].index is None:
            continue  # held as the checkpoint holds it
        missing += [disk for disk in where if disk not in tensors]
        if any(disk not in tensors for disk in where):
            continue
        target = torch.empty(shape, dtype=tensors[next(iter(where))].dtype)
        for disk, placement in where.items():
            copy_placed(target, placement, out.pop(disk), disk)
        out[name] = target
    if missing:
        raise ValueError(
            f"weights do not fit {type(model).__name__}: missing {sorted(missing)[:5]}; "
            "were they published for another model?"
        )
    return out
