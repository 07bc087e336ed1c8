"""One trainer rank: `python -m rollart.workers.trainer_rank --rdzv HOST:PORT --gen G --rank R --local-rank L ...`.

Started by the trainer worker (workers/trainer_ranks.py), never by hand. It reads its generation's
LaunchSpec from the rendezvous store, joins the process group (gloo on CPUs, NCCL on GPUs), builds
its share of the policy (megatron's, or the torch backend's FSDP2 shard with `trainer.fsdp`), resumes it
from the run dir, says it is ready, then runs the
commands the agent posts. Rank 0 reads each step's batch and broadcasts it; the others follow.
A rank that fails posts why and exits: the agent restarts the whole group. It also exits when its
agent dies (parent-death signal), so no rank outlives the worker that started it.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import sys
from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from rollart.activities.training.policy import Policy
    from rollart.activities.training.ranks import Ranks
    from rollart.workers.rank_messages import LaunchSpec

__all__ = ["main"]

log = logging.getLogger("rollart.trainer_rank")

COLLECTIVE_TIMEOUT = timedelta(minutes=10)
"""How long a collective may wait for a peer before it fails (a dead peer's agent kills us sooner)."""

COMMAND_WAIT = timedelta(days=7)
"""How long a rank waits for its next command (rollout between steps may take long)."""


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when its parent (the agent) dies; exit now if it already has."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:  # not Linux: the broken store connection ends us instead
        pass
    if os.getppid() != parent_pid:
        os._exit(1)


def _step_error_type(e: BaseException) -> str | None:
    """TrainStepFailed for an exception the step's own code raised and would raise again (an IndexError, a
    ValueError, ...); None when it may be a peer's death or the infrastructure: RuntimeError (gloo and NCCL
    report a dead peer as one, and torch its shape errors), OSError, the store's errors. The agent fails a step
    whose fresh ranks fail it again with the same cause."""
    from rollart.contracts.errors import ErrorType

    if isinstance(e, Exception) and not isinstance(e, RuntimeError | OSError):
        return ErrorType.TRAIN_STEP_FAILED.value
    return None


def _non_retryable(e: BaseException) -> bool:
    from temporalio.exceptions import ApplicationError

    from rollart.activities.training.devices import DeviceUnavailable
    from rollart.activities.training.fsdp_checkpoint import CheckpointMismatch
    from rollart.activities.training.megatron.checkpoint import TensorParallelMismatch
    from rollart.activities.training.megatron.hf_layout import UnsupportedModel

    if isinstance(e, ApplicationError):  # bad input the policy refused (a model fsdp cannot shard, ...)
        return e.non_retryable
    mismatch = TensorParallelMismatch | CheckpointMismatch
    return isinstance(e, DeviceUnavailable | UnsupportedModel | mismatch | FileNotFoundError)


def _policy_and_ranks(spec: LaunchSpec, device: torch.device) -> tuple[Policy, Ranks]:
    """This rank's share of the job's policy and its view of the group: megatron's tensor × data layout, or
    (`trainer.fsdp`) the torch backend sharded over every rank."""
    import torch

    cfg = spec.trainer
    if cfg.fsdp is not None:
        from rollart.activities.training.fsdp_policy import FsdpPolicy
        from rollart.activities.training.ranks import FsdpRanks

        torch.manual_seed(cfg.seed)
        return FsdpPolicy(spec.model_dir, cfg, device), FsdpRanks(device)
    from rollart.activities.training.megatron.model import init_model_parallel
    from rollart.activities.training.megatron.policy import MegatronPolicy
    from rollart.activities.training.ranks import DistributedRanks

    init_model_parallel(cfg.parallel.tensor, cfg.seed, device, expert=cfg.parallel.expert)
    torch.manual_seed(cfg.seed)
    return MegatronPolicy(spec.model_dir, cfg, device), DistributedRanks(device)


def run(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    from temporalio.exceptions import ApplicationError

    from rollart.activities.training.devices import resolve_device
    from rollart.activities.training.step import TrainerState, resume, train_step
    from rollart.infra.store.payload import open_store
    from rollart.workers.rank_messages import LaunchSpec, RankCommand, RankError, RankReply, key

    host, port = args.rdzv.rsplit(":", 1)
    store = dist.TCPStore(host, int(port), is_master=False, timeout=COMMAND_WAIT)
    gen = args.gen

    def fail(e: BaseException, during: str, in_step: bool = False) -> int:
        deterministic = _step_error_type(e) if in_step else None
        err = RankError(
            type=deterministic or type(e).__name__,
            message=f"trainer rank {args.rank} failed {during}: {type(e).__name__}: {e}",
            non_retryable=deterministic is not None or _non_retryable(e),
            cause=f"{type(e).__name__}: {e}",
        )
        log.exception("rank %d failed %s", args.rank, during)
        store.compare_set(key(gen, "failed"), "", err.model_dump_json())  # the first failure is the cause
        return 1

    try:
        spec = LaunchSpec.model_validate_json(store.get(key(gen, "launch")))
        cfg = spec.trainer
        device = resolve_device(cfg.device, args.local_rank, spec.per_node)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        else:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // (2 * spec.per_node)))
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            store=dist.PrefixStore(key(gen, "pg"), store),
            rank=args.rank,
            world_size=spec.world_size,
            timeout=COLLECTIVE_TIMEOUT,
        )
        policy, ranks = _policy_and_ranks(spec, device)
        payloads = open_store(spec.store)
        state = TrainerState(policy, resume(policy, ranks, payloads, spec.job_id, spec.run_dir))
    except BaseException as e:
        return fail(e, "to start")
    store.add(key(gen, "ready"), 1)
    log.info(
        "rank %d/%d ready on %s at step %d (job %s)",
        args.rank,
        spec.world_size,
        device,
        state.last_completed,
        spec.job_id,
    )
    n = 0
    while True:
        cmd = RankCommand.model_validate_json(store.get(key(gen, "cmd", n)))  # blocks until the agent posts it
        if cmd.op == "stop" or cmd.step is None:
            return 0
        reply = None
        try:
            result = train_step(state, ranks, payloads, cmd.step, spec.keep_weight_versions)
            reply = RankReply(result=result)
        except ApplicationError as e:
            if not e.non_retryable:
                return fail(e, f"in step {cmd.step.step}")
            reply = RankReply(error=RankError(type=e.type or "ApplicationError", message=e.message, non_retryable=True))
        except BaseException as e:
            return fail(e, f"in step {cmd.step.step}", in_step=True)
        if ranks.is_leader:
            store.set(key(gen, "result", n), reply.model_dump_json())
        n += 1


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m rollart.workers.trainer_rank", description=__doc__)
    p.add_argument("--rdzv", required=True, help="HOST:PORT of the agent's TCPStore")
    p.add_argument("--gen", required=True, help="the launch generation this rank belongs to")
    p.add_argument("--rank", type=int, required=True, help="global rank")
    p.add_argument("--local-rank", type=int, required=True, help="rank on this node (picks its GPU)")
    p.add_argument("--parent-pid", type=int, required=True, help="the agent's pid (this rank dies with it)")
    args = p.parse_args(argv)
    _die_with_parent(args.parent_pid)
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s %(levelname).1s rank{args.rank} %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    import warnings

    # megatron-core warns about every fusion library it falls back from (TE, apex) and logs its DDP buckets
    warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\..*")
    logging.getLogger("megatron").setLevel(logging.WARNING)
    rc = run(args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)  # no process-group teardown: a peer may already be gone


if __name__ == "__main__":
    main()
