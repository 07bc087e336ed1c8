"""Which device a trainer computes on, decided once, with an error that says what to change.

`auto` means cuda when this process sees a GPU, else cpu: one job file serves this machine and a GPU
cluster. Asking for `cuda` where there is none is a configuration error, not something a retry fixes.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["DeviceUnavailable", "resolve_device"]


class DeviceUnavailable(RuntimeError):
    """The job asks for a device this machine does not have."""


def resolve_device(wanted: str, local_rank: int = 0, local_ranks: int = 1) -> torch.device:
    """The device for local rank `local_rank` of `local_ranks` on this node (`wanted`: auto | cpu | cuda)."""
    import torch

    if wanted == "cpu" or (wanted == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise DeviceUnavailable(
            f"trainer.device is cuda, but this process sees no GPU (torch {torch.__version__}, {build}; "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}). Use trainer.device: auto (cuda where "
            "a GPU is visible, else cpu) or cpu, or run the trainer worker on a GPU node (`make setup` installs the "
            "CUDA build where nvidia-smi works)."
        )
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise DeviceUnavailable(
            f"this node runs {local_ranks} trainer ranks on cuda but sees {count} GPU(s): give it one GPU per rank "
            "(trainer.parallel tensor × data / --nnodes ranks per node), or run more nodes"
        )
    return torch.device("cuda", local_rank)
