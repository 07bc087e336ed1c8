"""The policy loss on per-token tensors: PPO-clip (plain or AReaL-decoupled), truncated IS, k3 KL, entropy.

Every function is pure torch on `[batch, seq]` tensors with a float mask, small
enough to check by hand. Per-token values are summed and divided by
`total_tokens`, the number of loss tokens in the *whole* train batch, so the
losses (and metrics) of micro-batches add up to exactly the token-mean of the
batch: gradient accumulation over any split gives the same gradient.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rollart.activities.rl.chunked_logprobs import (
    head_logprobs,
    head_logprobs_and_entropy,
    logits_logprobs,
    logits_logprobs_and_entropy,
)
from rollart.spec.config import LossConfig

__all__ = [
    "LossTerms",
    "head_logprobs",
    "head_logprobs_and_entropy",
    "k3_kl",
    "logits_logprobs",
    "logits_logprobs_and_entropy",
    "loss_token_weights",
    "policy_loss",
    "ppo_clip_surrogate",
    "token_logprobs",
    "token_logprobs_and_entropy",
]


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, chunk_tokens: int | None = None) -> torch.Tensor:
    """log π(input_ids[:, t] | input_ids[:, :t]) at every position t ≥ 1; position 0 is 0.

    Why this alignment: the result lines up with `input_ids`, so the same
    completion mask selects the completion tokens in ids, behaviour logprobs
    and trainer logprobs alike. `logits` is `[B, T, V]` (the model's raw
    output: no temperature, matching vLLM's `raw_logprobs`). With `chunk_tokens` the fp32 upcast is taken that
    many tokens at a time (`chunked_logprobs`: the same values, a fraction of the memory).
    """
    if chunk_tokens is not None:
        return logits_logprobs(logits, input_ids, chunk_tokens)
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.nn.functional.pad(picked, (1, 0))


def token_logprobs_and_entropy(
    logits: torch.Tensor, input_ids: torch.Tensor, chunk_tokens: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token logprobs (as `token_logprobs`) and the entropy of the distribution that predicted each token.

    Entropy H_t = −Σ_v p log p of the distribution at t−1 (the one that sampled
    token t), aligned like the logprobs; position 0 is 0. One log-softmax
    serves both; with `chunk_tokens`, `chunk_tokens` tokens at a time (`chunked_logprobs`).
    """
    if chunk_tokens is not None:
        return logits_logprobs_and_entropy(logits, input_ids, chunk_tokens)
    logp_all = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = logp_all.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    pad = (1, 0)
    return torch.nn.functional.pad(picked, pad), torch.nn.functional.pad(entropy, pad)


def ppo_clip_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, clip_eps: float, clip_eps_high: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The PPO objective per token, min(ratio·A, clip(ratio, 1−ε, 1+ε_high)·A), and where the clip is active.

    ε_high defaults to ε (symmetric PPO); DAPO's clip-higher widens it. Active means the clipped term is the
    smaller one, so the token gets no gradient: A > 0 with ratio > 1+ε_high, or A < 0 with ratio < 1−ε.
    """
    high = clip_eps if clip_eps_high is None else clip_eps_high
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + high) * advantages
    return torch.minimum(unclipped, clipped), clipped < unclipped


def k3_kl(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(π‖π_ref) per token: exp(ref − logp) − (ref − logp) − 1.

    Why k3: unbiased on samples from π, always ≥ 0, and low-variance.
    """
    d = logp_ref - logp
    return torch.exp(d) - d - 1.0


@dataclass
class LossTerms:
    """A micro-batch's loss (to backpropagate) and its metrics, each already divided by `total_tokens`.

    Because every value is a share of the whole batch's token-mean, the values
    of all micro-batches *add* to the batch's metrics.
    """

    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)


def loss_token_weights(
    mask: torch.Tensor, cfg: LossConfig, total_tokens: float, total_sequences: int | None
) -> torch.Tensor:
    """Each token's weight in the batch's loss under `cfg.aggregation` (0 off the mask), such that summing
    weight × value over every micro-batch gives the batch's aggregate, however the batch is split."""
    if cfg.aggregation == "token_mean":
        return mask / total_tokens
    if not total_sequences or total_sequences <= 0:
        raise ValueError(
            f"aggregation {cfg.aggregation!r} needs total_sequences > 0 (the batch's sequences with loss tokens)"
        )
    if cfg.aggregation == "seq_mean":
        return mask / (mask.sum(-1, keepdim=True).clamp(min=1.0) * total_sequences)
    return mask / (float(cfg.constant_tokens) * total_sequences)


def policy_loss(
    logp: torch.Tensor,
    logp_behav: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    *,
    total_tokens: float,
    total_sequences: int | None = None,
    logp_prox: torch.Tensor | None = None,
    logp_ref: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    bonus_weight: torch.Tensor | None = None,
) -> LossTerms:
    """The loss of one micro-batch per `LossConfig`, normalised by the batch's `total_tokens`.

    `logp` (with grad), `logp_behav` (the engine's logprobs when it sampled),
    `mask` (1.0 on completion tokens) are `[B, T]`; `advantages` is `[B]` (one
    per sequence) or `[B, T]`.

    - `decoupled` (AReaL): ratio = π/π_prox, PPO-clipped, times the detached
      behaviour weight w = π_prox/π_behav, truncated at `tis_cap`. The clip
      bounds how far *this update* moves from the trainer's own policy, while
      w corrects for the data having been sampled by an older (stale) policy.
    - otherwise: plain PPO-clip with ratio = π/π_behav, no extra weight.

    `logp_prox` defaults to `logp.detach()`: the trainer makes exactly one
    optimizer update per train step, so the proximal policy (the weights
    before this update) *is* the current forward pass; no second forward is
    needed. The ratio's value is then 1 and its gradient is ∇logp, so the clip
    never binds (clip_frac is 0) and the loss reduces to −w·A·logp. Pass
    `logp_prox` explicitly for multi-update schemes (and hand-checked tests).

    Adds `kl_coef`·k3(π, π_ref) when `logp_ref` is given and subtracts
    `entropy_coef`·entropy when `entropy` is given (entropy is always
    reported when given, even at coef 0); `bonus_weight` (`[B]`) scales the bonus per sequence (the metric
    stays over every token). The loss terms are aggregated per
    `cfg.aggregation` (`loss_token_weights`; `total_sequences` counts the batch's
    sequences with loss tokens), the metrics are token means whatever it is.
    """
    if total_tokens <= 0:
        raise ValueError("total_tokens must be > 0: a train batch needs at least one completion token")
    mask = mask.to(logp.dtype)
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    adv = adv.to(logp.dtype)
    if logp_prox is None:
        logp_prox = logp.detach()
    logp_prox = logp_prox.detach()
    logp_behav = logp_behav.detach().to(logp.dtype)

    def share(x: torch.Tensor) -> torch.Tensor:
        """Sum over loss tokens / total_tokens (this micro-batch's share of the batch mean)."""
        return (x * mask).sum() / total_tokens

    weights = loss_token_weights(mask, cfg, total_tokens, total_sequences)

    def aggregate(x: torch.Tensor) -> torch.Tensor:
        """This micro-batch's share of the batch's loss term, per `cfg.aggregation`."""
        return (x * weights).sum()

    raw_w = torch.exp(logp_prox - logp_behav)
    truncated = torch.zeros_like(raw_w, dtype=torch.bool)
    if cfg.decoupled:
        ratio = torch.exp(logp - logp_prox)
        weight = raw_w
        if cfg.tis_cap is not None:
            truncated = raw_w > cfg.tis_cap
            weight = raw_w.clamp(max=cfg.tis_cap)
    else:
        ratio = torch.exp(logp - logp_behav)
        weight = torch.ones_like(raw_w)
    surrogate, clipped = ppo_clip_surrogate(ratio, adv, cfg.clip_eps, cfg.clip_eps_high)
    pg = aggregate(-weight * surrogate)
    loss = pg
    metrics = {
        "pg_loss": pg.item(),
        "clip_frac": share(clipped.to(logp.dtype)).item(),
        "is_weight_mean": share(weight if cfg.decoupled else raw_w).item(),
        "is_truncated_frac": share(truncated.to(logp.dtype)).item(),
        "logprob_diff_behav": share((logp_prox - logp_behav).abs()).item(),
    }
    if logp_ref is not None:
        kl = k3_kl(logp, logp_ref.detach())
        loss = loss + cfg.kl_coef * aggregate(kl)
        metrics["kl"] = share(kl).item()
    if entropy is not None:
        if cfg.entropy_coef > 0:
            bonus = entropy if bonus_weight is None else entropy * bonus_weight.to(entropy.dtype).unsqueeze(-1)
            loss = loss - cfg.entropy_coef * aggregate(bonus)
        metrics["entropy"] = share(entropy).item()
    metrics["loss"] = loss.item()
    return LossTerms(loss=loss, metrics=metrics)
