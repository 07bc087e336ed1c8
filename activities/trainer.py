"""The `train_step` activity: one GRPO/PPO update of a job's policy, then publish the new version.

Two backends run the same step code (`activities.training.step`):

- `torch` (default): a transformers model held in this worker's own process, per job.
- `megatron`: a megatron-core GPTModel on `trainer.parallel` tensor × data ranks; the trainer
  worker hands each step to its `RankLauncher` (workers/trainer_ranks.py), whose rank 0 broadcasts
  the batch to the others. `torch` with `trainer.fsdp` runs on such ranks too (FSDP2 over `fsdp.ranks`).
  A rank that dies fails the step with a retryable error; the ranks are
  started afresh from the last checkpoint and the retry completes.

A step is idempotent: its result is recorded in `run_dir/steps/` and a repeated call returns the
record without touching the weights, so Temporal may retry freely. What is retried: a lost trainer
(its heartbeats stop), a dead rank (`TrainerRankFailed`), the store or a file system briefly failing
(`INFRA_ERRORS`). What is not: an exception of the step's own code (a shape error, an index out of
range, a bad value) fails `TrainStepFailed`, non-retryable, naming the step, the job and the cause.
Workflow code must never import this module (it imports torch); workflows call the activity by name
with `TrainStepInput`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Protocol, TypeVar

import torch
from temporalio import activity
from temporalio.exceptions import ApplicationError

from rollart.activities.errors import INFRA_ERRORS, bad_input, train_step_failed
from rollart.activities.heartbeat import heartbeating
from rollart.activities.training.devices import DeviceUnavailable, resolve_device
from rollart.activities.training.ranks import OneProcess
from rollart.activities.training.records import checkpoint_dir, read_record, step_record_path
from rollart.activities.training.step import TrainerState, resume, train_step
from rollart.activities.training.torch_policy import TorchPolicy
from rollart.contracts.activities import TrainStepInput, TrainStepResult
from rollart.infra.store.payload import Store

__all__ = ["HEARTBEAT_EVERY_S", "RankLauncher", "TrainerActivities", "checkpoint_dir", "step_record_path"]

log = logging.getLogger(__name__)

HEARTBEAT_EVERY_S = 5.0
"""How often the activity heartbeats while the torch work runs in its thread."""

_T = TypeVar("_T")


class RankLauncher(Protocol):
    """Runs steps on a group of trainer ranks (megatron, or torch with fsdp); see workers/trainer_ranks.py."""

    def run_step(self, inp: TrainStepInput, cancelled: threading.Event) -> TrainStepResult:
        """Run `inp` on the ranks (starting them if needed) and return rank 0's result; blocking.

        Raises `ApplicationError`: non-retryable for bad input, retryable when a rank died.
        """


def _rank_layout(inp: TrainStepInput) -> str:
    cfg = inp.trainer
    return f"fsdp ranks {cfg.fsdp.ranks}" if cfg.fsdp is not None else f"backend {cfg.backend}"


class TrainerActivities:
    """Binds `train_step` to the payload store; torch models are loaded per job on first use.

    `torch_threads`: intra-op threads for torch (process-wide), applied when
    the first job loads; None leaves torch's default. Default 1: on 2 cores, a
    step of 64 sequences × ~20 tokens of the tiny model took ~0.075 s with one
    thread and ~0.095 s with two (thread sync costs more than it saves on
    such small matrices), and one thread leaves a core for the event loop.
    `ranks`: where megatron and fsdp steps go (None: this worker trains with torch in one process only).
    """

    def __init__(
        self,
        store: Store,
        *,
        torch_threads: int | None = 1,
        keep_weight_versions: int = 2,
        ranks: RankLauncher | None = None,
    ) -> None:
        self.store = store
        self.keep_weight_versions = keep_weight_versions
        self.torch_threads = torch_threads
        self.ranks = ranks
        self._jobs: dict[str, TrainerState] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    @activity.defn(name="train_step")
    async def train_step(self, inp: TrainStepInput) -> TrainStepResult:
        """Run train step `inp.step` (policy v`step` → v`step+1`), or return its recorded result if already run."""
        if not inp.samples:
            raise bad_input(
                f"train step {inp.step} of job {inp.job_id!r} got no samples; the workflow must send a non-empty batch"
            )
        recorded = await asyncio.to_thread(read_record, inp.run_dir, inp.step)
        if recorded is not None:
            return recorded.model_copy(update={"replayed": True})
        lock = self._locks.setdefault(inp.job_id, asyncio.Lock())
        async with lock:
            # A previous attempt of this very step may have finished while we waited for the lock.
            recorded = await asyncio.to_thread(read_record, inp.run_dir, inp.step)
            if recorded is not None:
                return recorded.model_copy(update={"replayed": True})
            async with heartbeating(HEARTBEAT_EVERY_S, first_now=True):
                if inp.trainer.backend == "megatron" or inp.trainer.fsdp is not None:
                    return await self._on_ranks(inp)
                return await _in_thread(lambda: self._step_here(inp))

    async def _on_ranks(self, inp: TrainStepInput) -> TrainStepResult:
        if self.ranks is None:
            raise bad_input(
                f"job {inp.job_id!r} asks for trainer ranks ({_rank_layout(inp)}), but this trainer worker has no "
                "rank launcher; run it with `rollart worker --pool trainer`"
            )
        ranks, cancelled = self.ranks, threading.Event()
        return await _in_thread(lambda: ranks.run_step(inp, cancelled), on_cancel=cancelled.set)

    # ---- the torch backend (runs in a worker thread) ------------------------------------------

    def _step_here(self, inp: TrainStepInput) -> TrainStepResult:
        state = self._jobs.get(inp.job_id)
        if state is None:
            state = self._jobs[inp.job_id] = self._load_state(inp)
        try:
            result = train_step(state, OneProcess(), self.store, inp, self.keep_weight_versions)
        except ApplicationError as e:  # bad input or the wrong step: refused before the weights were touched
            if not e.non_retryable:
                self._jobs.pop(inp.job_id, None)
            raise
        except Exception as e:
            # The in-memory weights may be ahead of what is recorded: forget them, reload on the next call.
            self._jobs.pop(inp.job_id, None)
            if isinstance(e, INFRA_ERRORS):
                raise
            raise train_step_failed(inp.job_id, inp.step, e) from e
        if result is None:
            raise RuntimeError("a single-process trainer is its own leader and must return the step's result")
        return result

    def _load_state(self, inp: TrainStepInput) -> TrainerState:
        """Model + AdamW for a job: the newest checkpoint if any, then the published weights of later recorded steps."""
        if self.torch_threads is not None:
            torch.set_num_threads(self.torch_threads)
        cfg = inp.trainer
        try:
            device = resolve_device(cfg.device)
        except DeviceUnavailable as e:
            raise bad_input(f"job {inp.job_id!r}: {e}") from e
        torch.manual_seed(cfg.seed)
        try:
            policy = TorchPolicy(inp.model_dir, cfg, device)
            last = resume(policy, OneProcess(), self.store, inp.job_id, inp.run_dir)
        except ValueError as e:  # a checkpoint or published version that does not fit this trainer section
            raise bad_input(f"job {inp.job_id!r}: {e}") from e
        log.info("job %s: torch trainer ready at step %d on %s (model %s)", inp.job_id, last, device, inp.model_dir)
        return TrainerState(policy=policy, last_completed=last)


async def _in_thread(fn: Callable[[], _T], on_cancel: Callable[[], None] | None = None) -> _T:
    """Run `fn` in a thread; if the caller is cancelled, tell `fn` (`on_cancel`) and wait for it before re-raising.

    Why: the thread cannot be interrupted, and the job's lock must stay held
    until it is done, or a retry would train on the same model concurrently.
    """
    task = asyncio.ensure_future(asyncio.to_thread(fn))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if on_cancel is not None:
            on_cancel()
        await asyncio.wait([task])
        raise
