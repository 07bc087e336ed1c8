"""Token log-probs and entropies from vocabulary-parallel logits, without gathering the vocabulary.

With tensor parallelism each rank holds logits for its slice of the vocabulary `[B, T, V/tp]`.
What the loss needs per position is two numbers, so each rank reduces its slice and the ranks
all-reduce `[B, T]` tensors: the max (for stability), Σ exp, the target's logit (only the rank
owning the target has it) and Σ exp·z. The all-reduces are megatron's
`reduce_from_tensor_model_parallel_region` (sum forward, identity backward): every rank computes
the same loss from the reduced values, so each back-propagates exactly its own slice's share.
Vocabulary padding (rows added so V divides by tp) is masked out: it never gets probability.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from rollart.activities.rl.action_entropy import ActionSpace, ActionTerm, action_entropy, class_sums, entropy_by_task

__all__ = ["vocab_parallel_action_entropy", "vocab_parallel_logprobs_and_entropy"]


def vocab_parallel_logprobs_and_entropy(
    logits: torch.Tensor, input_ids: torch.Tensor, vocab_start: int, vocab_size: int, *, entropy_grad: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log π(input_ids[:, t] | ..) and the entropy at t−1, aligned with `input_ids` (position 0 is 0), as
    `rl.losses.token_logprobs_and_entropy` gives them from full logits.

    `logits` is this rank's `[B, T, V_local]` slice, covering ids `vocab_start .. vocab_start+V_local`;
    ids ≥ `vocab_size` are padding. The entropy carries a gradient only when `entropy_grad`.
    """
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region as all_sum

    z = logits[:, :-1].float()
    targets = input_ids[:, 1:]
    local = z.shape[-1]
    ids = torch.arange(vocab_start, vocab_start + local, device=z.device)
    padding = ids >= vocab_size
    with torch.no_grad():
        m = z.masked_fill(padding, float("-inf")).amax(-1, keepdim=True)
        if ps.get_tensor_model_parallel_world_size() > 1:
            torch.distributed.all_reduce(
                m, op=torch.distributed.ReduceOp.MAX, group=ps.get_tensor_model_parallel_group()
            )
    z = z - m
    e = z.exp().masked_fill(padding, 0.0)
    sum_exp = all_sum(e.sum(-1))
    log_z = sum_exp.log()
    owned = (targets >= vocab_start) & (targets < vocab_start + local)
    picked = z.gather(-1, (targets - vocab_start).clamp(0, local - 1).unsqueeze(-1)).squeeze(-1)
    logp = all_sum(torch.where(owned, picked, torch.zeros_like(picked))) - log_z
    if entropy_grad:
        entropy = log_z - all_sum((e * z).sum(-1)) / sum_exp
    else:
        with torch.no_grad():
            entropy = log_z.detach() - all_sum((e * z).sum(-1)) / sum_exp.detach()
    return F.pad(logp, (1, 0)), F.pad(entropy, (1, 0))


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
