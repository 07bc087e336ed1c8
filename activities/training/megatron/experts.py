"""A mixture-of-experts model's experts over the expert-parallel ranks: which rank publishes which, the HF
tensors they are, and their share of the global gradient norm.

With `trainer.parallel.expert` X, each MoE layer's experts are split X ways over the data-parallel ranks
(megatron's expert-parallel group: X consecutive ranks at tensor 1); the data-parallel replicas of one
expert shard form its expert-data-parallel group, whose gradients megatron's DDP sums. So one copy of
every expert lives on the ranks of expert-data-parallel rank 0: those publish (and checkpoint) them, each
its own, under their global HF names, with no gather. Dense tensors stay with data-parallel rank 0.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist

from rollart.activities.training.megatron.convert import hf_of
from rollart.activities.training.megatron.hf_layout import HfArch

__all__ = [
    "equal_tokens_over_experts",
    "expert_flags",
    "gather_experts_hf",
    "is_expert",
    "local_experts_hf",
    "squared_norm",
]


class _EqualTokens:
    """Forward hooks of one MoE layer that pad its input to the largest [tokens, rows] of the expert-parallel
    group and cut its output back, so every rank of the group all-gathers the same shape.

    Megatron's allgather dispatcher gathers every rank's tokens with equal-size all-gathers, but data ranks train
    on micro-batches of their own lengths (and the lockstep fillers are smaller still). The padding is zeros
    after the layer's norm: the router scores them (ties, no load-balancing loss, no capacity limit), the experts
    map them to 0, and cutting them off leaves every real token's output and gradient unchanged."""

    def __init__(self) -> None:
        self._shapes: list[tuple[int, int]] = []

    def pad(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        from megatron.core import parallel_state as ps

        hidden = args[0]
        seq, rows = hidden.shape[0], hidden.shape[1]
        most = torch.tensor([seq, rows], dtype=torch.int64, device=hidden.device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX, group=ps.get_expert_tensor_and_model_parallel_group())
        s, b = int(most[0]), int(most[1])
        self._shapes.append((seq, rows))
        if (s, b) == (seq, rows):
            return args, kwargs
        hidden = torch.nn.functional.pad(hidden, (0, 0, 0, b - rows, 0, s - seq))
        mask = kwargs.get("padding_mask")
        if mask is not None:  # [rows, seq], True for real tokens
            kwargs = {**kwargs, "padding_mask": torch.nn.functional.pad(mask, (0, s - seq, 0, b - rows), value=False)}
        return (hidden, *args[1:]), kwargs

    def cut(self, module: torch.nn.Module, args: tuple, kwargs: dict, output: tuple) -> tuple:
        seq, rows = self._shapes.pop()
        out, bias = output
        return out[:seq, :rows], bias


def equal_tokens_over_experts(model: torch.nn.Module) -> None:
    """Pad every MoE layer's tokens to the expert-parallel group's largest shape (see `_EqualTokens`)."""
    from megatron.core.transformer.moe.moe_layer import MoELayer

    for layer in model.modules():
        if isinstance(layer, MoELayer):
            hooks = _EqualTokens()
            layer.register_forward_pre_hook(hooks.pad, with_kwargs=True)
            layer.register_forward_hook(hooks.cut, with_kwargs=True)


def is_expert(name: str) -> bool:
    """Whether megatron parameter `name` is one of this rank's experts (not replicated over the data ranks)."""
    return ".mlp.experts." in name


def expert_flags(module: torch.nn.Module) -> list[bool]:
    """`is_expert` of each trainable parameter, in `module.parameters()` order."""
    return [is_expert(n) for n, p in module.named_parameters() if p.requires_grad]


def _first_expert(arch: HfArch) -> int:
    from megatron.core import parallel_state as ps

    return ps.get_expert_model_parallel_rank() * arch.num_experts // ps.get_expert_model_parallel_world_size()


def holds_expert_copy() -> bool:
    """Whether this rank's experts are the copy that is published and checkpointed (expert-data rank 0)."""
    from megatron.core import parallel_state as ps

    return ps.get_expert_data_parallel_rank() == 0


def local_experts_hf(module: torch.nn.Module, arch: HfArch, grads: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """This rank's experts (or their gradients) as HF tensors, if it holds the published copy; else nothing."""
    if not arch.is_moe or not holds_expert_copy():
        return
    first = _first_expert(arch)
    for name, p in module.named_parameters():
        if is_expert(name):
            t = p.main_grad if grads else p.detach()
            yield from hf_of(name, [t], arch, first).items()


def gather_experts_hf(module: torch.nn.Module, arch: HfArch, grads: bool = False) -> dict[str, torch.Tensor]:
    """Every expert as float32 CPU HF tensors on global rank 0 (a collective of the expert-parallel group that
    holds the published copy; other ranks, and rank 0 of a dense model, get {})."""
    from megatron.core import parallel_state as ps

    if not arch.is_moe or not holds_expert_copy():
        return {}
    mine = {k: v.float().cpu().clone() for k, v in local_experts_hf(module, arch, grads)}
    if ps.get_expert_model_parallel_world_size() == 1:
        return mine
    group = ps.get_expert_model_parallel_group()
    parts: list | None = [None] * dist.get_world_size(group) if ps.get_expert_model_parallel_rank() == 0 else None
    dist.gather_object(mine, parts, dst=dist.get_global_rank(group, 0), group=group)
    return {k: v for part in parts or () for k, v in part.items()}


def squared_norm(grads: list[torch.Tensor], flags: list[bool], counted: list[bool]) -> torch.Tensor:
    """Σ‖g‖² over the whole model, before the tensor-parallel sum: the `counted` dense gradients (each tensor-
    parallel shard once) plus every expert's, summed over the expert-parallel group (each rank holds its own)."""
    from megatron.core import parallel_state as ps

    device = grads[0].device if grads else torch.device("cpu")
    dense = torch.zeros(1, dtype=torch.float64, device=device)
    experts = torch.zeros(1, dtype=torch.float64, device=device)
    for g, expert, count in zip(grads, flags, counted):
        if expert:
            experts += g.double().pow(2).sum()
        elif count:
            dense += g.double().pow(2).sum()
    if any(flags) and ps.get_expert_model_parallel_world_size() > 1:
        dist.all_reduce(experts, group=ps.get_expert_model_parallel_group())
    return dense + experts
