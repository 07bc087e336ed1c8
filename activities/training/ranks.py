"""Where a train step runs: one process, or one rank of a torch.distributed group (tensor × data parallel).

The step code (`activities.training.step`) asks only what it needs: is this the leader (it reads the
batch and publishes), which data-parallel share of the sequences is this rank's, and two
collectives (broadcast an object from the leader, sum metrics over data-parallel ranks, gather what each
rank published).
`OneProcess` answers for the torch backend; `DistributedRanks` for megatron's ranks; `FsdpRanks` for the
torch backend's FSDP2 ranks (one data-parallel group: the whole world), whose forward passes are
collectives, so every rank must run as many (`forward_in_lockstep`, `activities.training.lockstep`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

__all__ = ["DistributedRanks", "FsdpRanks", "OneProcess", "Ranks"]


class Ranks(ABC):
    """The step's view of the process group it runs in."""

    rank: int = 0
    world_size: int = 1
    data_rank: int = 0
    data_size: int = 1
    forward_in_lockstep: bool = False
    """Every forward pass is a collective (FSDP gathers each layer's weights in it): a rank with fewer
    micro-batches than another must run no-loss ones until they match."""

    @property
    def is_leader(self) -> bool:
        """Rank 0: reads the batch from the store, publishes weights, writes the step record."""
        return self.rank == 0

    @abstractmethod
    def broadcast(self, obj: Any) -> Any:
        """The leader's `obj` on every rank (what the others pass is ignored)."""

    @abstractmethod
    def sum_over_data(self, values: dict[str, float]) -> dict[str, float]:
        """Each key summed over the data-parallel ranks (every rank must pass the same keys)."""

    def max_over_data(self, value: int) -> int:
        """The largest `value` any data-parallel rank passes (a collective where there are several)."""
        return value

    @abstractmethod
    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's `obj`, in rank order, on the leader; None on the others."""

    @abstractmethod
    def barrier(self) -> None:
        """Wait until every rank gets here."""


class OneProcess(Ranks):
    """A single process: every collective is the identity."""

    def broadcast(self, obj: Any) -> Any:
        return obj

    def sum_over_data(self, values: dict[str, float]) -> dict[str, float]:
        return dict(values)

    def gather(self, obj: Any) -> list[Any] | None:
        return [obj]

    def barrier(self) -> None:
        return None


class DistributedRanks(Ranks):
    """A rank of the initialised default process group, with megatron's tensor/data-parallel groups.

    `device` is where collectives put their tensors (NCCL needs CUDA tensors, gloo CPU ones).
    """

    def __init__(self, device: torch.device) -> None:
        from megatron.core import parallel_state as ps

        self._init(device, ps.get_data_parallel_rank(), ps.get_data_parallel_world_size(), ps.get_data_parallel_group())
        # MoE with expert parallelism: each MoE layer all-gathers the tokens of the expert-parallel group's ranks
        self.forward_in_lockstep = ps.get_expert_model_parallel_world_size() > 1

    def _init(self, device: torch.device, data_rank: int, data_size: int, data_group: Any) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.device = device
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.data_rank = data_rank
        self.data_size = data_size
        self._data_group = data_group

    def broadcast(self, obj: Any) -> Any:
        box = [obj]
        self._dist.broadcast_object_list(box, src=0, device=self.device if self.device.type == "cuda" else None)
        return box[0]

    def sum_over_data(self, values: dict[str, float]) -> dict[str, float]:
        if self.data_size == 1:
            return dict(values)
        keys = sorted(values)
        t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=self.device)
        self._dist.all_reduce(t, group=self._data_group)
        return dict(zip(keys, t.tolist()))

    def max_over_data(self, value: int) -> int:
        if self.data_size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX, group=self._data_group)
        return int(t.item())

    def gather(self, obj: Any) -> list[Any] | None:
        out: list[Any] | None = [None] * self.world_size if self.is_leader else None
        self._dist.gather_object(obj, out, dst=0)
        return out

    def barrier(self) -> None:
        self._dist.barrier()


class FsdpRanks(DistributedRanks):
    """A rank of the initialised default process group, all of whose ranks are data-parallel (FSDP2):
    each trains on its share of the sequences, its forward passes in lockstep with the others'."""

    forward_in_lockstep = True

    def __init__(self, device: torch.device) -> None:
        import torch.distributed as dist

        self._init(device, dist.get_rank(), dist.get_world_size(), None)
