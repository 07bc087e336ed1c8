"""Token log-probs and entropies from vocabulary-parallel logits, without gathering the vocabulary.

With tensor parallelism each rank holds logits for its slice of the vocabulary `[B, T, V/tp]`.
What the loss needs per position is two numbers, so each rank reduces its slice and the ranks
all-reduce per-token tensors: the max (for stability), Σ exp, the target's logit (only the rank
owning the target has it) and Σ exp·z. Every rank computes the same loss from the reduced values, so
each back-propagates exactly its own slice's share (megatron's sum-forward, identity-backward reduction).
Log-probs and entropies are taken `chunk_tokens` tokens at a time, so the fp32 upcast of the slice is
never whole. Vocabulary padding (rows added so V divides by tp) is masked out: it never gets probability.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from rollart.activities.rl.action_entropy import ActionSpace, ActionTerm, action_entropy, class_sums, entropy_by_task
from rollart.activities.rl.chunked_logprobs import chunks, next_token_targets

__all__ = ["vocab_parallel_action_entropy", "vocab_parallel_logprobs_and_entropy"]


def vocab_parallel_logprobs_and_entropy(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    vocab_start: int,
    vocab_size: int,
    *,
    entropy_grad: bool,
    chunk_tokens: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log π(input_ids[:, t] | ..) and the entropy at t−1, aligned with `input_ids` (position 0 is 0), as
    `rl.losses.token_logprobs_and_entropy` gives them from full logits.

    `logits` is this rank's `[B, T, V_local]` slice, covering ids `vocab_start .. vocab_start+V_local`;
    ids ≥ `vocab_size` are padding. The entropy carries a gradient only when `entropy_grad`. The slice is
    upcast to fp32 `chunk_tokens` tokens at a time (`trainer.logprob_chunk_tokens`), in the forward and again
    in the backward, so no fp32 `[tokens, V_local]` block of the whole micro-batch is ever held.
    """
    if logits.dim() != 3 or logits.shape[:2] != input_ids.shape:
        raise ValueError(f"expected [B, T, V_local] logits matching input_ids {tuple(input_ids.shape)}")
    flat = logits.reshape(-1, logits.shape[-1])  # a view of a contiguous model output: no copy
    logp, entropy = _VocabParallelChunks.apply(
        flat, next_token_targets(input_ids), vocab_start, vocab_size, chunk_tokens
    )
    b, t = input_ids.shape
    logp = F.pad(logp.view(b, t)[:, :-1], (1, 0))
    entropy = F.pad(entropy.view(b, t)[:, :-1], (1, 0))
    return logp, entropy if entropy_grad else entropy.detach()


def _tp_sum(x: torch.Tensor) -> torch.Tensor:
    """`x` summed over the tensor-parallel ranks, in place."""
    from megatron.core import parallel_state as ps

    if ps.get_tensor_model_parallel_world_size() > 1:
        torch.distributed.all_reduce(x, group=ps.get_tensor_model_parallel_group())
    return x


def _tp_max(x: torch.Tensor) -> torch.Tensor:
    from megatron.core import parallel_state as ps

    if ps.get_tensor_model_parallel_world_size() > 1:
        torch.distributed.all_reduce(x, op=torch.distributed.ReduceOp.MAX, group=ps.get_tensor_model_parallel_group())
    return x


class _VocabParallelChunks(torch.autograd.Function):
    """Per token of `[N, V_local]` logits: the forward all-reduces the max, Σ exp, the target's logit and Σ exp·z
    (each `[chunk]`) chunk by chunk and keeps the max, log Σ exp and the entropy; the backward recomputes each
    chunk's p = exp(z − m − log Σ exp) and writes its slice's gradient, with no collective: every rank computes
    the same loss from the reduced values, so d logp/dz_j = 1[j = target] − p_j and dH/dz_j = −p_j (log p_j + H)
    on its own slice are the whole of it (what megatron's sum-forward/identity-backward reduction gives)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, logits: torch.Tensor, targets: torch.Tensor, vocab_start: int, vocab_size: int, chunk_tokens: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n, local = logits.shape
        padding = torch.arange(vocab_start, vocab_start + local, device=logits.device) >= vocab_size
        stats = torch.empty(3, n, dtype=torch.float32, device=logits.device)  # max, log Σ exp, entropy
        logp = torch.empty(n, dtype=torch.float32, device=logits.device)
        for s, e in chunks(n, chunk_tokens):
            z = logits[s:e].float()
            m = _tp_max(z.masked_fill(padding, float("-inf")).amax(-1, keepdim=True))
            z = z - m
            ex = z.exp().masked_fill(padding, 0.0)
            sum_exp = _tp_sum(ex.sum(-1))
            log_z = sum_exp.log()
            tgt = targets[s:e]
            owned = (tgt >= vocab_start) & (tgt < vocab_start + local)
            picked = z.gather(-1, (tgt - vocab_start).clamp(0, local - 1).unsqueeze(-1)).squeeze(-1)
            logp[s:e] = _tp_sum(torch.where(owned, picked, torch.zeros_like(picked))) - log_z
            stats[0, s:e], stats[1, s:e] = m.squeeze(-1), log_z
            stats[2, s:e] = log_z - _tp_sum((ex * z).sum(-1)) / sum_exp
        ctx.save_for_backward(logits, targets, stats)
        ctx.vocab_start, ctx.vocab_size, ctx.chunk_tokens = vocab_start, vocab_size, chunk_tokens
        ctx.set_materialize_grads(False)
        return logp, stats[2].clone()

    @staticmethod
    def backward(ctx: Any, g_logp: torch.Tensor | None, g_entropy: torch.Tensor | None) -> tuple:
        logits, targets, stats = ctx.saved_tensors
        if g_logp is None and g_entropy is None:
            return None, None, None, None, None
        n, local = logits.shape
        start = ctx.vocab_start
        padding = torch.arange(start, start + local, device=logits.device) >= ctx.vocab_size
        grad = torch.empty_like(logits)
        for s, e in chunks(n, ctx.chunk_tokens):
            g = logits[s:e].float() - (stats[0, s:e] + stats[1, s:e]).unsqueeze(-1)  # log p, then the gradient
            p = g.exp().masked_fill_(padding, 0.0)
            if g_entropy is None:
                g = p.mul_(-g_logp[s:e].unsqueeze(-1))
            else:
                g.add_(stats[2, s:e].unsqueeze(-1)).mul_(g_entropy[s:e].unsqueeze(-1))
                if g_logp is not None:
                    g.add_(g_logp[s:e].unsqueeze(-1))
                g.mul_(p).neg_()
            del p
            if g_logp is not None:
                tgt = targets[s:e]
                owned = (tgt >= start) & (tgt < start + local)
                gl = torch.where(owned, g_logp[s:e], 0.0).unsqueeze(-1)
                g.scatter_add_(-1, (tgt - start).clamp(0, local - 1).unsqueeze(-1), gl)
            grad[s:e] = g
        return grad, None, None, None, None


def vocab_parallel_action_entropy(
    logits: torch.Tensor, tasks: Sequence[str], term: ActionTerm, vocab_start: int, vocab_size: int
) -> torch.Tensor:
    """The entropy over each row's env's actions at t−1 (`rl.action_entropy`), aligned like the log-probs, from
    this rank's vocabulary slice: each rank sums its slice's exp(z) per action, and the ranks all-reduce
    `[B, T, actions]`. The normaliser Σ exp cancels in the renormalisation over actions, so it is not needed."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region as all_sum

    z = logits[:, :-1].float()
    local = z.shape[-1]
    padding = torch.arange(vocab_start, vocab_start + local, device=z.device) >= vocab_size
    with torch.no_grad():
        m = z.masked_fill(padding, float("-inf")).amax(-1, keepdim=True)
        if ps.get_tensor_model_parallel_world_size() > 1:
            torch.distributed.all_reduce(
                m, op=torch.distributed.ReduceOp.MAX, group=ps.get_tensor_model_parallel_group()
            )
    e = (z - m).exp().masked_fill(padding, 0.0)

    def rows(idx: torch.Tensor, space: ActionSpace) -> torch.Tensor:
        classes = space.classes_for(vocab_start, local, e.device)
        # contiguous: megatron all-reduces `input_.contiguous()` and returns `input_`, so a view's sum would be lost
        sums = class_sums(e[idx.to(e.device)], classes, len(space.names)).contiguous()
        return F.pad(action_entropy(all_sum(sums), term.form), (1, 0))

    return entropy_by_task(tasks, term.spaces, rows)
