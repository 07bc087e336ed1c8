"""Several optimizer updates per train step: PPO mini-batches and epochs.

With `trainer.mini_batches: M` and `trainer.ppo_epochs: E` a step cuts its batch into M mini-batches
and steps the optimizer once per mini-batch, E passes over the batch (reshuffled each pass): M × E
updates. The decoupled loss's proximal policy is the policy *before the first of them*, so its
log-probs are computed once, up front, without grad; from the second update on the ratio π/π_prox
leaves 1 and the PPO clip bounds how far the step moves the policy. (With one update the current
forward pass is the proximal policy, and `train_step` skips this module.)

Mini-batches are cut from each data-parallel rank's share of the batch. Every rank computes every
share, so all agree on each mini-batch's token and sequence totals (the loss normalisers) and each
rank steps exactly M × E times, as gradient all-reduces require, even one whose part is empty.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

import torch

from rollart.activities.rl.action_entropy import ActionTerm
from rollart.activities.rl.batch import TrainSequence, micro_batch, micro_batch_indices, micro_batches
from rollart.activities.rl.losses import policy_loss
from rollart.activities.training.lockstep import fillers, in_lockstep
from rollart.activities.training.policy import Policy, StepOutcome
from rollart.activities.training.ranks import Ranks
from rollart.contracts.ids import derive_seed
from rollart.spec.config import TrainerConfig

__all__ = [
    "LOSS_METRICS",
    "SHRINKS_MAX",
    "accumulate_gradients",
    "data_shard",
    "epoch_seed",
    "logprob_change",
    "mini_batch_parts",
    "packed_tokens",
    "ppo_updates",
    "step_within_limit",
    "updates",
    "with_proximal_logprobs",
]

SHRINKS_MAX = 6
"""Halvings of one update at most (to 1/64 of it) under `trainer.max_logprob_change`."""

LOSS_METRICS = (
    "loss",
    "pg_loss",
    "clip_frac",
    "is_weight_mean",
    "is_truncated_frac",
    "logprob_diff_behav",
    "kl",
    "entropy",
)
"""What the loss reports per step (each a share of the batch's token mean, summed over micro-batches and ranks)."""


def packed_tokens(cfg: TrainerConfig) -> int | None:
    """The token budget of a packed micro-batch (`trainer.packing`), or None: padded micro-batches."""
    return None if cfg.packing is None else cfg.packing.max_tokens


def data_shard(seqs: Sequence[TrainSequence], rank: int, size: int) -> list[TrainSequence]:
    """Data-parallel rank `rank`'s share of the sequences: longest first, each to the rank with the fewest tokens.

    Every rank computes the same assignment, so the shares are disjoint and cover the batch.
    """
    if size == 1:
        return list(seqs)
    loads = [0] * size
    mine: list[TrainSequence] = []
    for s in sorted(seqs, key=lambda s: -s.length):
        r = min(range(size), key=lambda i: (loads[i], i))
        loads[r] += s.length
        if r == rank:
            mine.append(s)
    return mine


def accumulate_gradients(
    policy: Policy,
    seqs: Sequence[TrainSequence],
    total_tokens: int,
    cfg: TrainerConfig,
    total_sequences: int | None = None,
    actions: ActionTerm | None = None,
    ranks: Ranks | None = None,
) -> dict[str, float]:
    """Forward/backward this rank's micro-batches, summing gradients; returns this rank's share of the loss metrics.

    `total_tokens` and `total_sequences` are the whole batch's (all ranks'), so the shares add up. Sequences
    carrying `prox_logprobs` are clipped against those; otherwise the current forward pass is the proximal policy.
    With `actions` the entropy (bonus and metric) is over each task's actions (`entropy_over: actions`)."""
    loss_cfg = cfg.loss
    policy.zero_grad()
    totals = dict.fromkeys(LOSS_METRICS, 0.0)
    batches = micro_batches(seqs, cfg.micro_batch_size, policy.pad_id, packed_tokens(cfg))
    for mb in in_lockstep(
        ranks, batches, policy.pad_id, actions, cfg.packing is not None
    ):  # FSDP: as many passes as every other rank
        mb = mb.to(policy.device)
        logp, entropy = policy.logprobs(mb, entropy_grad=loss_cfg.entropy_coef > 0, actions=actions)
        logp_ref = policy.ref_logprobs(mb) if loss_cfg.kl_coef > 0 else None
        terms = policy_loss(
            logp,
            mb.behav_logprobs,
            mb.advantages,
            mb.completion_mask,
            loss_cfg,
            total_tokens=total_tokens,
            total_sequences=total_sequences,
            logp_prox=mb.prox_logprobs,
            logp_ref=logp_ref,
            entropy=entropy,
            bonus_weight=mb.bonus,
        )
        terms.loss.backward()
        for k, v in terms.metrics.items():
            totals[k] += v
    return totals


def with_proximal_logprobs(
    policy: Policy,
    seqs: Sequence[TrainSequence],
    micro_batch_size: int,
    max_tokens: int | None = None,
    ranks: Ranks | None = None,
) -> list[TrainSequence]:
    """`seqs` with `prox_logprobs` set: the current policy's log-probs of their completions (no grad), over the
    whole completion like `behav_logprobs` (`collate` zeroes them off the loss mask). The micro-batches are
    those of training: padded, or packed with `max_tokens`."""
    out = list(seqs)
    groups = micro_batch_indices(seqs, micro_batch_size, max_tokens)
    extra = fillers(
        ranks, len(groups), policy.pad_id, packed=max_tokens is not None
    )  # FSDP: as many forward passes as every other rank
    with torch.no_grad():
        for mb in extra:
            policy.logprobs(mb.to(policy.device), entropy_grad=False)
        for idx in groups:
            mb = micro_batch([seqs[i] for i in idx], policy.pad_id, packed=max_tokens is not None).to(policy.device)
            logp = policy.logprobs(mb, entropy_grad=False)[0].float().cpu()
            for row, i in enumerate(idx):
                p, c = len(seqs[i].prompt_ids), len(seqs[i].completion_ids)
                out[i] = replace(seqs[i], prox_logprobs=logp[row, p : p + c].tolist())
    return out


def logprob_change(
    policy: Policy,
    ranks: Ranks,
    seqs: Sequence[TrainSequence],
    micro_batch_size: int,
    max_tokens: int | None = None,
) -> float:
    """Mean |log π − log π_prox| over the loss tokens of `seqs` (which carry `prox_logprobs`), every data-parallel
    rank's `seqs` together: how far the policy has moved from the one before the step, where it was trained."""
    moved, tokens = 0.0, 0.0
    with torch.no_grad():
        batches = micro_batches(seqs, micro_batch_size, policy.pad_id, max_tokens)
        for mb in in_lockstep(ranks, batches, policy.pad_id, packed=max_tokens is not None):
            mb = mb.to(policy.device)
            if mb.prox_logprobs is None:
                raise ValueError("logprob_change needs sequences with prox_logprobs (with_proximal_logprobs)")
            logp = policy.logprobs(mb, entropy_grad=False)[0].float()
            mask = mb.completion_mask.float()
            moved += float(((logp - mb.prox_logprobs.float()).abs() * mask).sum())
            tokens += float(mask.sum())
    total = ranks.sum_over_data({"moved": moved, "tokens": tokens})
    return total["moved"] / max(total["tokens"], 1.0)


def step_within_limit(policy: Policy, ranks: Ranks, seqs: Sequence[TrainSequence], cfg: TrainerConfig) -> StepOutcome:
    """One optimizer step; with `trainer.max_logprob_change` it is halved (up to `SHRINKS_MAX` times) while the
    trained tokens' log-probs (`seqs`, with `prox_logprobs`) moved more than that on average from the policy
    before the train step. A trust region in what the policy does, not in its weights: AdamW's normalised step
    can move a small model's log-probs by nats at once (the weights each move by ~lr, all in the direction of
    the gradient's sign). Every rank takes the same decisions: the change is summed over data ranks."""
    limit = cfg.max_logprob_change
    if limit is None:
        return policy.step(cfg)
    policy.remember_weights()
    try:
        outcome = policy.step(cfg)
        if not outcome.applied:
            return outcome
        change, shrinks = logprob_change(policy, ranks, seqs, cfg.micro_batch_size, packed_tokens(cfg)), 0
        while change > limit and shrinks < SHRINKS_MAX:
            policy.shrink_update(0.5)
            shrinks += 1
            change = logprob_change(policy, ranks, seqs, cfg.micro_batch_size, packed_tokens(cfg))
        return replace(outcome, logprob_change=change, shrinks=shrinks)
    finally:
        policy.forget_weights()


def mini_batch_parts(share_sizes: Sequence[int], count: int, seed: int) -> list[list[list[int]]]:
    """For each rank's share (of `share_sizes[r]` sequences): its `count` parts as lists of indices.

    Shuffled by `seed`, then cut into parts whose sizes differ by at most one. `count` is capped by the
    smallest non-empty share, so no rank holding data gets an empty part (ranks without data get empty
    parts and still step: their gradient is zero).
    """
    held = [n for n in share_sizes if n > 0]
    count = max(1, min([count, *held]))
    parts: list[list[list[int]]] = []
    for r, n in enumerate(share_sizes):
        order = list(range(n))
        random.Random(derive_seed(seed, r)).shuffle(order)
        parts.append([order[j * n // count : (j + 1) * n // count] for j in range(count)])
    return parts


def epoch_seed(cfg: TrainerConfig, step: int, epoch: int) -> int:
    """The shuffle of `epoch` of train step `step`: the same on every rank and on every retry of the step."""
    return (cfg.seed * 7919 + step) * 64 + epoch


def ppo_updates(
    policy: Policy,
    ranks: Ranks,
    shares: Sequence[Sequence[TrainSequence]],
    cfg: TrainerConfig,
    step: int,
    actions: ActionTerm | None = None,
) -> tuple[dict[str, float], list[StepOutcome]]:
    """Run the step's M × E updates on this rank's share; the loss metrics averaged over the updates, and
    what each update did. `shares` is every data-parallel rank's share of the batch, in rank order."""
    mine = with_proximal_logprobs(policy, shares[ranks.data_rank], cfg.micro_batch_size, packed_tokens(cfg), ranks)
    sums = dict.fromkeys(LOSS_METRICS, 0.0)
    outcomes: list[StepOutcome] = []
    for epoch in range(cfg.ppo_epochs):
        parts = mini_batch_parts([len(s) for s in shares], cfg.mini_batches, epoch_seed(cfg, step, epoch))
        for j in range(len(parts[0])):
            chosen = [[share[i] for i in parts[r][j]] for r, share in enumerate(shares)]
            tokens = sum(s.loss_tokens for part in chosen for s in part)
            sequences = sum(1 for part in chosen for s in part if s.loss_tokens)
            own = [mine[i] for i in parts[ranks.data_rank][j]]
            metrics = ranks.sum_over_data(
                accumulate_gradients(policy, own, max(tokens, 1), cfg, max(sequences, 1), actions, ranks)
            )
            outcomes.append(step_within_limit(policy, ranks, own, cfg))
            for k in sums:
                sums[k] += metrics[k]
    return {k: v / len(outcomes) for k, v in sums.items()}, outcomes


def updates(
    policy: Policy,
    ranks: Ranks,
    seqs: Sequence[TrainSequence],
    total_sequences: int,
    cfg: TrainerConfig,
    step: int,
    actions: ActionTerm | None = None,
) -> tuple[dict[str, float], list[StepOutcome]]:
    """A train step's optimizer update(s) on this rank's share of `seqs` (the whole batch): one over the whole
    batch, or PPO's mini-batches and epochs (`ppo_updates`); the loss metrics and what each update did."""
    if cfg.mini_batches == 1 and cfg.ppo_epochs == 1:
        mine = data_shard(seqs, ranks.data_rank, ranks.data_size)
        if cfg.max_logprob_change is not None:  # the limit measures against the policy before the update
            mine = with_proximal_logprobs(policy, mine, cfg.micro_batch_size, packed_tokens(cfg), ranks)
        total_tokens = sum(s.loss_tokens for s in seqs)
        metrics = ranks.sum_over_data(
            accumulate_gradients(policy, mine, total_tokens, cfg, total_sequences, actions, ranks)
        )
        return metrics, [step_within_limit(policy, ranks, mine, cfg)]
    shares = [data_shard(seqs, r, ranks.data_size) for r in range(ranks.data_size)]
    return ppo_updates(policy, ranks, shares, cfg, step, actions)
