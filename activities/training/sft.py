"""Supervised fine-tuning (a warm start before RL) on the job's trainer backend: mean NLL of the replies' tokens.

A model that never emits a task's format (a tool call, an answer tag) gives RL nothing to reinforce; imitating a
few thousand correct transcripts first teaches the format, and RL then improves what the model does with it. The
step is the RL trainer's own machinery (`Policy.logprobs`, its AdamW with the job's lr, betas, clipping and
schedule, its checkpoints), only with the loss −mean log π(reply token) over the batch's reply tokens, so SFT and
RL train the same weights the same way. Any `Policy` serves: the torch backend, or megatron's on one rank (its
tensor- and data-parallel ranks are processes the trainer worker starts, which this one-process loop lacks).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from rollart.activities.rl.batch import MicroBatch
from rollart.activities.training.lr_schedule import scheduled
from rollart.activities.training.policy import Policy
from rollart.activities.training.records import checkpoint_dir
from rollart.activities.training.sft_data import SftSequence
from rollart.contracts.ids import derive_seed
from rollart.spec.config import TrainerConfig

__all__ = ["SftOptions", "SftProgress", "SftResult", "batch_indices", "collate_sft", "reply_nll", "train_sft"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SftOptions:
    """How long and how: optimizer steps, sequences per step, their shuffle, and when to checkpoint (0: only at the
    end, when checkpointing at all: never with 0)."""

    steps: int
    batch_size: int
    seed: int = 0
    checkpoint_every: int = 0


@dataclass(frozen=True)
class SftProgress:
    """One step done: its 0-based index, its loss (mean NLL per reply token), and the throughput so far."""

    step: int
    steps: int
    loss: float
    grad_norm: float
    tokens: int  # all tokens (prompt and reply) through the model so far in this run
    tokens_per_s: float


@dataclass(frozen=True)
class SftResult:
    """What a run did: steps made in this run, the first and last steps' losses, tokens, wall time, where it resumed."""

    steps_run: int
    first_loss: float | None
    last_loss: float | None
    tokens: int
    wall_s: float
    resumed_at: int  # the step it started at (0, or one past a checkpoint's)


def batch_indices(n: int, batch_size: int, seed: int, step: int) -> list[int]:
    """The transcripts of step `step`: a window of an endless stream of epochs, each a fresh shuffle of `n`.

    A pure function of the step, so a resumed run trains on exactly the batches the first would have.
    """
    orders: dict[int, list[int]] = {}  # the one or two epochs this step's window touches
    out = []
    for k in range(step * batch_size, (step + 1) * batch_size):
        epoch, at = divmod(k, n)
        if epoch not in orders:
            orders[epoch] = list(range(n))
            random.Random(derive_seed(seed, epoch)).shuffle(orders[epoch])
        out.append(orders[epoch][at])
    return out


def collate_sft(seqs: Sequence[SftSequence], pad_id: int) -> MicroBatch:
    """Right-padded tensors of `seqs`; the loss mask (`completion_mask`) is 1 on reply tokens only."""
    width = max(len(s.ids) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.float32)
    for i, s in enumerate(seqs):
        ids[i, : len(s.ids)] = torch.tensor(s.ids)
        attention[i, : len(s.ids)] = 1
        mask[i, : len(s.mask)] = torch.tensor(s.mask, dtype=torch.float32)
    zeros = torch.zeros((len(seqs), width))
    return MicroBatch(ids, attention, mask, zeros, torch.zeros(len(seqs)))


def reply_nll(policy: Policy, mb: MicroBatch) -> torch.Tensor:
    """The summed negative log-likelihood of `mb`'s reply tokens under `policy` (with grad)."""
    logp, _ = policy.logprobs(mb.to(policy.device), entropy_grad=False)
    return -(logp * mb.completion_mask.to(logp.device)).sum()


def train_sft(
    policy: Policy,
    cfg: TrainerConfig,
    sequences: Sequence[SftSequence],
    options: SftOptions,
    run_dir: Path,
    on_step: Callable[[SftProgress], None] | None = None,
) -> SftResult:
    """Train `policy` for `options.steps` optimizer steps on `sequences`; resume from `run_dir`'s newest checkpoint.

    Each step's loss is the batch's summed reply NLL over its reply-token count (micro-batches of
    `cfg.micro_batch_size` accumulate into one update), stepped with `cfg`'s AdamW at the schedule's rate.
    """
    if not sequences:
        raise ValueError("no transcripts to train on")
    cfg = cfg.over(options.steps)
    ckpt = checkpoint_dir(run_dir)
    done = policy.load_checkpoint(ckpt)
    start = 0 if done is None else done + 1
    if done is not None:
        log.info("sft: resumed from the checkpoint of step %d in %s", done, ckpt)
    t0 = time.monotonic()
    tokens, first, last = 0, None, None
    for step in range(start, options.steps):
        batch = [sequences[i] for i in batch_indices(len(sequences), options.batch_size, options.seed, step)]
        loss, grad_norm = _one_step(policy, scheduled(cfg, step), batch)
        tokens += sum(len(s.ids) for s in batch)
        first = loss if first is None else first
        last = loss
        rate = tokens / max(time.monotonic() - t0, 1e-9)
        if on_step is not None:
            on_step(SftProgress(step, options.steps, loss, grad_norm, tokens, rate))
        if options.checkpoint_every and (step + 1) % options.checkpoint_every == 0 and step + 1 < options.steps:
            policy.save_checkpoint(ckpt, step)
    if options.checkpoint_every and start < options.steps:
        policy.save_checkpoint(ckpt, options.steps - 1)
    return SftResult(
        steps_run=max(0, options.steps - start),
        first_loss=first,
        last_loss=last,
        tokens=tokens,
        wall_s=time.monotonic() - t0,
        resumed_at=start,
    )


def _one_step(policy: Policy, cfg: TrainerConfig, batch: list[SftSequence]) -> tuple[float, float]:
    """One optimizer update over `batch`: its mean reply NLL and the gradient norm."""
    total = sum(s.trained_tokens for s in batch)
    if total == 0:
        raise ValueError("a batch with no reply tokens: every transcript needs an assistant message")
    policy.zero_grad()
    loss = 0.0
    for i in range(0, len(batch), cfg.micro_batch_size):
        nll = reply_nll(policy, collate_sft(batch[i : i + cfg.micro_batch_size], policy.pad_id)) / total
        nll.backward()
        loss += float(nll.detach())
    outcome = policy.step(cfg)
    return loss, outcome.grad_norm
