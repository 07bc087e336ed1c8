"""Token log-probs and entropies taken `chunk_tokens` tokens at a time, so the fp32 `[tokens, vocabulary]` block of
a whole micro-batch never exists: from the model's logits, or fused with the LM head from its last hidden states.

Why: `losses.token_logprobs_and_entropy` upcasts `[B, T, V]` logits to fp32 and keeps the log-softmax and its exp
for the backward pass; at 8k tokens and a 152k vocabulary each such block is ~5 GB. Here the forward keeps only
two numbers per token, and the backward recomputes each chunk's fp32 log-softmax (and, fused, its logits) and
writes that chunk's gradient before taking the next. Each chunk's values come from exactly the ops of `losses`
(log_softmax, gather, −Σ p log p), so they equal today's (fused: up to the rounding of a matmul over fewer rows);
its gradient is their closed form, computed in place (two fp32 blocks of the chunk where autograd's graph holds
five), equal to autograd's up to fp32 rounding. The head's gradient sums over chunks in fp32.

Alignment as in `losses`: position t is log p(ids[t] | ids[:t]), position 0 is 0; `[B, T]` out.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

__all__ = [
    "chunks",
    "head_logprobs",
    "head_logprobs_and_entropy",
    "logits_logprobs",
    "logits_logprobs_and_entropy",
    "next_token_targets",
]


def chunks(n: int, size: int) -> Iterator[tuple[int, int]]:
    """`[start, end)` ranges of at most `size` covering `0 .. n`."""
    if size < 1:
        raise ValueError(f"chunk_tokens must be ≥ 1, got {size}")
    for start in range(0, n, size):
        yield start, min(start + size, n)


def next_token_targets(input_ids: torch.Tensor) -> torch.Tensor:
    """`[B*T]`: at flat position (b, t) the id the distribution there predicts, ids[b, t+1]; 0 at t = T−1 (a
    position whose values are dropped), so logits can be read as one `[B*T, V]` view without a copy."""
    targets = torch.zeros_like(input_ids)
    targets[:, :-1] = input_ids[:, 1:]
    return targets.reshape(-1)


def _values(z: torch.Tensor, targets: torch.Tensor, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One chunk's log-probs and entropies, by `losses.token_logprobs_and_entropy`'s own ops (fp32)."""
    logp_all = torch.log_softmax(z.float(), dim=-1)
    picked = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
    return picked, entropy


def _chunk_logits(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    """A chunk's logits: `x` itself, or the head applied to the hidden states `x` (as `nn.Linear` does)."""
    return x if weight is None else F.linear(x, weight, bias)


class _ChunkedLogprobs(torch.autograd.Function):
    """Log-probs (and entropies) of `[N, V]` logits or of `[N, H]` hidden states through a `[V, H]` head, chunk by
    chunk; the backward recomputes each chunk's logits and log-softmax and writes its gradient before the next."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        chunk_tokens: int,
        with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = x.shape[0]
        logp = torch.empty(n, dtype=torch.float32, device=x.device)
        entropy = torch.zeros(n, dtype=torch.float32, device=x.device)
        for s, e in chunks(n, chunk_tokens):
            lp, ent = _values(_chunk_logits(x[s:e], weight, bias), targets[s:e], with_entropy)
            logp[s:e] = lp
            if ent is not None:
                entropy[s:e] = ent
        ctx.save_for_backward(x, weight, bias, targets, entropy)
        ctx.chunk_tokens, ctx.with_entropy = chunk_tokens, with_entropy
        ctx.set_materialize_grads(False)  # a detached entropy gets None: its gradient is not computed
        return logp, entropy

    @staticmethod
    def backward(ctx: Any, g_logp: torch.Tensor | None, g_entropy: torch.Tensor | None) -> tuple:
        x, weight, bias, targets, entropy = ctx.saved_tensors
        if not ctx.with_entropy:
            g_entropy = None
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        if g_logp is None and g_entropy is None:
            return None, None, None, None, None, None
        grad_x = torch.empty_like(x) if need_x else None
        # the head's gradient sums over chunks: in fp32, so a bf16 head loses no more than one matmul would
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if need_w else None
        grad_b = torch.zeros_like(bias, dtype=torch.float32) if need_b else None
        for s, e in chunks(x.shape[0], ctx.chunk_tokens):
            xs = x[s:e]
            z = _chunk_logits(xs, weight, bias)
            g_z = _logits_grad(
                z,
                targets[s:e],
                None if g_logp is None else g_logp[s:e],
                None if g_entropy is None else g_entropy[s:e],
                entropy[s:e],
            ).to(z.dtype)
            del z
            if weight is None:
                grad_x[s:e] = g_z
                continue
            if need_x:
                torch.mm(g_z, weight, out=grad_x[s:e])
            if need_w:
                _add_head_grad(grad_w, g_z, xs)
            if need_b:
                grad_b += g_z.sum(0)
        return (
            grad_x,
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(bias.dtype),
            None,
            None,
            None,
        )


_HEAD_ROWS = 16384
"""Rows of the head's gradient made per matmul in a lower precision than its fp32 sum, bounding that partial."""


def _add_head_grad(grad_w: torch.Tensor, g_z: torch.Tensor, xs: torch.Tensor) -> None:
    """grad_w (fp32) += g_zᵀ·xs: in place when fp32, else through partials of `_HEAD_ROWS` rows, so no second
    head-sized tensor is made (the matmul runs in the model's dtype, as autograd's would)."""
    if g_z.dtype == grad_w.dtype:
        grad_w.addmm_(g_z.t(), xs)
        return
    for s, e in chunks(grad_w.shape[0], _HEAD_ROWS):
        grad_w[s:e] += g_z[:, s:e].t() @ xs


def _logits_grad(
    z: torch.Tensor,
    targets: torch.Tensor,
    g_logp: torch.Tensor | None,
    g_entropy: torch.Tensor | None,
    entropy: torch.Tensor,
) -> torch.Tensor:
    """d(Σ g_logp·logp + Σ g_entropy·H)/dz of one chunk, in fp32: 1[j = target]·g_logp − p_j·(g_logp +
    g_entropy·(log p_j + H)), what autograd gives through log_softmax, gather and −Σ p log p (equal up to
    rounding), computed in place in two fp32 blocks where autograd's graph holds five."""
    grad = torch.log_softmax(z.float(), dim=-1)
    p = grad.exp()
    if g_entropy is None:
        grad = p.mul_(-g_logp.unsqueeze(-1))
    else:
        grad.add_(entropy.unsqueeze(-1)).mul_(g_entropy.unsqueeze(-1))
        if g_logp is not None:
            grad.add_(g_logp.unsqueeze(-1))
        grad.mul_(p).neg_()
    del p
    if g_logp is not None:
        grad.scatter_add_(-1, targets.unsqueeze(-1), g_logp.unsqueeze(-1))
    return grad


def _aligned(flat: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """`[B*T]` per flat position (value at t predicts t+1) → `[B, T]` aligned with the ids, position 0 is 0."""
    return F.pad(flat.view(shape[0], shape[1])[:, :-1], (1, 0))


def _run(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    input_ids: torch.Tensor,
    chunk_tokens: int,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    if x.dim() != 3 or x.shape[:2] != input_ids.shape:
        raise ValueError(f"expected [B, T, *] matching input_ids {tuple(input_ids.shape)}, got {tuple(x.shape)}")
    flat = x.reshape(-1, x.shape[-1])  # a view of a contiguous model output: no copy
    logp, entropy = _ChunkedLogprobs.apply(
        flat, weight, bias, next_token_targets(input_ids), chunk_tokens, with_entropy
    )
    return _aligned(logp, input_ids.shape), _aligned(entropy, input_ids.shape)


def logits_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, chunk_tokens: int) -> torch.Tensor:
    """`losses.token_logprobs` of `[B, T, V]` logits (any dtype), upcast to fp32 `chunk_tokens` tokens at a time."""
    return _run(logits, None, None, input_ids, chunk_tokens, False)[0]


def logits_logprobs_and_entropy(
    logits: torch.Tensor, input_ids: torch.Tensor, chunk_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`losses.token_logprobs_and_entropy`, upcast to fp32 `chunk_tokens` tokens at a time. Detach the entropy
    when it needs no gradient: its backward is then skipped."""
    return _run(logits, None, None, input_ids, chunk_tokens, True)


def head_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    input_ids: torch.Tensor,
    chunk_tokens: int,
) -> torch.Tensor:
    """`losses.token_logprobs` of the logits `hidden @ weight.T + bias` (`[B, T, H]`, `[V, H]`, `[V]`), which
    never exist whole: each chunk's are made, used and dropped, and made again in the backward."""
    return _run(hidden, weight, bias, input_ids, chunk_tokens, False)[0]


def head_logprobs_and_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    input_ids: torch.Tensor,
    chunk_tokens: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`losses.token_logprobs_and_entropy` fused with the LM head (as `head_logprobs`). Detach the entropy when
    it needs no gradient: its backward is then skipped."""
    return _run(hidden, weight, bias, input_ids, chunk_tokens, True)
