"""The LM head + log-probs + entropy alone, forward and backward: what `bench trainer_memory` measures per mode.

`head_logprobs_peak` runs one mode on random last hidden states and a random head in this process and returns
its peak memory growth and wall time, so a benchmark can compare today's full-vocabulary fp32 path with the
chunked ones (`activities/rl/chunked_logprobs.py`) without importing the trainer's internals.
"""

from __future__ import annotations

import os
import resource
import time
from typing import Any

import torch
import torch.nn.functional as F

from rollart.activities.rl.chunked_logprobs import head_logprobs_and_entropy, logits_logprobs_and_entropy
from rollart.activities.rl.losses import token_logprobs_and_entropy

__all__ = ["MODES", "head_logprobs_peak"]

MODES = ("today", "chunked", "fused")
"""`today`: logits = head(hidden), then the whole fp32 log-softmax (`losses.token_logprobs_and_entropy`);
`chunked`: the same logits taken `chunk` tokens at a time; `fused`: the head applied per chunk too."""

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _rss_mib() -> float:
    """The resident set now (MiB)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _forward(mode: str, h: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, chunk: int) -> tuple:
    if mode == "today":
        return token_logprobs_and_entropy(F.linear(h, w), ids)
    if mode == "chunked":
        return logits_logprobs_and_entropy(F.linear(h, w), ids, chunk)
    if mode == "fused":
        return head_logprobs_and_entropy(h, w, None, ids, chunk)
    raise ValueError(f"unknown mode {mode!r}; modes: {', '.join(MODES)}")


def head_logprobs_peak(
    mode: str, tokens: int, hidden: int, vocab: int, dtype: str, chunk: int, device: str
) -> dict[str, Any]:
    """One forward and backward of `mode` (loss Σ a·logp + Σ b·entropy, both with gradient, back to the hidden
    states and the head): peak memory growth over what the inputs hold (MiB) and wall time. The peak is
    `torch.cuda.max_memory_allocated` on CUDA; on the CPU the peak resident set (ru_maxrss) over the resident set
    once the inputs are made, which follows the live tensors because blocks this large are mmap'ed and unmapped
    when freed. Run it in a fresh process: ru_maxrss never goes down."""
    dt, dev = _DTYPES[dtype], torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(0)
    h = torch.randn(1, tokens, hidden, generator=gen, device=dev).to(dt).requires_grad_()
    w = (torch.randn(vocab, hidden, generator=gen, device=dev) / hidden**0.5).to(dt).requires_grad_()
    ids = torch.randint(0, vocab, (1, tokens), generator=gen, device=dev)
    a, b = torch.randn(1, tokens, generator=gen, device=dev), torch.randn(1, tokens, generator=gen, device=dev)
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() / 2**20 if cuda else _rss_mib()
    t0 = time.perf_counter()
    logp, ent = _forward(mode, h, w, ids, chunk)
    ((logp * a).sum() + (ent * b).sum()).backward()
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else _maxrss_mib()
    return {
        "peak_mb": peak - base,
        "wall_s": wall,
        "logp_mean": float(logp.detach()[:, 1:].mean()),
        "entropy_mean": float(ent.detach()[:, 1:].mean()),
        "grad_hidden_norm": float(h.grad.float().norm()),
        "grad_head_norm": float(w.grad.float().norm()),
    }
