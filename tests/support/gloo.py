"""Run a function on N gloo ranks (spawned processes on loopback) and collect what each returns.

For tests of the trainer backends' numerics: each rank sets up the default process group and (megatron's,
`run_on_ranks`) the tensor/data-parallel groups exactly as a trainer rank does, or nothing more (FSDP's,
`run_on_plain_ranks`), runs `fn(*args)`, and its return value comes back (through a file) as element `rank` of
the result list.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from rollart.infra.local.devserver import free_port


def _rank_main(
    rank: int,
    world: int,
    port: int,
    tensor: int | None,
    out_dir: str,
    fn: Callable[..., Any],
    args: tuple,
    expert: int = 1,
) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    out = Path(out_dir) / f"rank-{rank}.pkl"
    try:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=120)
        )
        if tensor is not None:  # megatron's groups; None: a plain process group (FSDP)
            from rollart.activities.training.megatron.model import init_model_parallel

            init_model_parallel(tensor, seed=0, device=torch.device("cpu"), expert=expert)
        result: Any = ("ok", fn(*args))
    except BaseException as e:  # the parent re-raises it with the rank's traceback
        result = ("error", f"rank {rank}: {type(e).__name__}: {e}\n{traceback.format_exc()}")
    out.write_bytes(pickle.dumps(result))
    os._exit(0)  # skip gloo's teardown (a peer may already be gone)


def run_on_plain_ranks(fn: Callable[..., Any], world: int, *args: Any) -> list[Any]:
    """`fn(*args)` on `world` gloo ranks of a plain process group (no megatron groups); each rank's result."""
    return run_on_ranks(fn, world, None, *args)


def run_on_ranks(fn: Callable[..., Any], world: int, tensor: int | None, *args: Any, expert: int = 1) -> list[Any]:
    """`fn(*args)` on `world` gloo ranks with megatron tensor-parallel size `tensor` (and expert-parallel size
    `expert`, for MoE models); each rank's result."""
    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(
            _rank_main,
            args=(world, free_port(), tensor, out_dir, fn, args, expert),
            nprocs=world,
            join=True,
            start_method="spawn",
        )
        results = []
        for rank in range(world):
            status, value = pickle.loads((Path(out_dir) / f"rank-{rank}.pkl").read_bytes())
            if status != "ok":
                raise RuntimeError(value)
            results.append(value)
        return results
