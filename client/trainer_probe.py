"""The trainer's forward and backward alone, timed: what `bench trainer_packing` measures padded vs packed.

`forward_backward` builds the torch backend on a model dir and runs `accumulate_gradients` (every micro-batch's
forward and backward, no optimizer step, no publish) over sequences given as plain dicts (the fields of
`TrainSequence`), so a benchmark can shape a batch without importing the trainer's internals.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from rollart.activities.rl.batch import TrainSequence
from rollart.activities.training.torch_policy import TorchPolicy
from rollart.activities.training.updates import accumulate_gradients
from rollart.spec.config import TrainerConfig

__all__ = ["forward_backward"]


def forward_backward(
    model_dir: str | Path,
    sequences: Sequence[Mapping[str, Any]],
    trainer: Mapping[str, Any],
    device: str = "cpu",
    attention: str | None = None,
) -> dict[str, Any]:
    """Wall seconds, tokens/s (real tokens), the loss and the attention implementation of one pass of the
    trainer's forward+backward over `sequences` with trainer config `trainer` (after a warm-up on 8 of them).
    `attention` overrides the model's attention implementation (e.g. `sdpa`: packed rows under a 4D mask)."""
    seqs = [TrainSequence(**s) for s in sequences]
    cfg = TrainerConfig(**{**trainer, "device": device})
    policy = TorchPolicy(model_dir, cfg, torch.device(device))
    if attention is not None:
        policy.model.set_attn_implementation(attention)
    total = sum(s.loss_tokens for s in seqs)
    accumulate_gradients(policy, seqs[:8], total, cfg, len(seqs))  # allocator and first-call costs
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    metrics = accumulate_gradients(policy, seqs, total, cfg, len(seqs))
    sync()
    wall = time.perf_counter() - t0
    tokens = sum(s.length for s in seqs)
    return {
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "loss": metrics["loss"],
        "tokens": float(tokens),
        "attention": str(policy.model.config._attn_implementation),
    }
