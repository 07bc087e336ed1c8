"""The RL math by hand: GRPO advantages, PPO-clip, decoupled PPO with truncated IS, k3 KL, entropy, accumulation."""

from __future__ import annotations

import math

import pytest
import torch

from rollart.activities.rl.advantages import groups_with_signal, grpo_advantages, in_unsolved_group
from rollart.activities.rl.batch import TrainSequence, collate, micro_batches
from rollart.activities.rl.losses import (
    k3_kl,
    loss_token_weights,
    policy_loss,
    ppo_clip_surrogate,
    token_logprobs,
    token_logprobs_and_entropy,
)
from rollart.spec.config import LossConfig

LN = math.log


def t(*xs: float) -> torch.Tensor:
    return torch.tensor([list(xs)], dtype=torch.float32)


# ---- advantages ------------------------------------------------------------------------------


def test_grpo_advantages_by_hand() -> None:
    rewards = [1, 0, 0, 0, 1, 3, 5, 2, 2]
    groups = ["a", "a", "a", "a", "b", "b", "single", "flat", "flat"]
    adv = grpo_advantages(rewards, groups)
    std_a = math.sqrt(0.25 * 0.75)  # population std of [1, 0, 0, 0]
    assert adv[:4] == pytest.approx([0.75 / std_a, -0.25 / std_a, -0.25 / std_a, -0.25 / std_a], abs=1e-5)
    assert adv[4:6] == pytest.approx([-1.0, 1.0], abs=1e-5)  # mean 2, std 1
    assert adv[6:] == [0.0, 0.0, 0.0]  # a singleton and a zero-std group carry no signal, exactly
    raw = grpo_advantages(rewards, groups, normalize_std=False)
    assert raw[:6] == pytest.approx([0.75, -0.25, -0.25, -0.25, -1.0, 1.0])
    assert groups_with_signal(adv, groups) == pytest.approx(0.5)  # a and b of a, b, single, flat
    assert groups_with_signal([], []) == 0.0
    with pytest.raises(ValueError, match="group id"):
        grpo_advantages([1.0], ["a", "b"])


def test_a_std_floor_keeps_tiny_differences_tiny_and_real_ones_normalised() -> None:
    """A group on one route where one member strays and scores 0.01 less: plain GRPO makes that a -2.6 std
    advantage, as strong failure; a floor of 0.1 keeps it at ~-0.09. A group whose rewards differ by
    more than the floor is normalised as before."""
    route = [0.43] * 7 + [0.42]
    plain = grpo_advantages(route, ["g"] * 8)
    floored = grpo_advantages(route, ["g"] * 8, std_floor=0.1)
    assert plain[-1] == pytest.approx(-math.sqrt(7), rel=1e-3)  # -(7/8 · 0.01) / (0.01 · √7/8)
    assert floored[-1] == pytest.approx(-0.00875 / 0.1, rel=1e-3) and floored[0] == pytest.approx(
        0.00125 / 0.1, rel=1e-3
    )
    real = [1.1, 0.43, 0.43, 0.43]
    assert grpo_advantages(real, ["h"] * 4, std_floor=0.1) == pytest.approx(grpo_advantages(real, ["h"] * 4))


# ---- PPO-clip surrogate -----------------------------------------------------------------------


def test_ppo_clip_surrogate_inside_and_outside_the_clip_range() -> None:
    ratio = torch.tensor([1.1, 1.5, 0.5, 1.5, 0.5, 0.9])
    adv = torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0, -2.0])
    surr, clipped = ppo_clip_surrogate(ratio, adv, 0.2)
    # A>0: min(r, clip(r))·A → 1.1 (inside), 1.2 (clipped above), 0.5 (below: no clip for A>0)
    # A<0: → −1.5 (above: no clip for A<0), −0.8 (clipped below), −1.8 (inside)
    assert surr.tolist() == pytest.approx([1.1, 1.2, 0.5, -1.5, -0.8, -1.8])
    assert clipped.tolist() == [False, True, False, False, True, False]


def test_clip_higher_widens_only_the_upper_side() -> None:
    ratio = torch.tensor([1.25, 1.5, 0.5, 0.7])
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    surr, clipped = ppo_clip_surrogate(ratio, adv, 0.2, clip_eps_high=0.28)
    # A>0: 1.25 is inside [0.8, 1.28] (symmetric PPO would clip it at 1.2); 1.5 clips at 1.28.
    # A<0: the lower side is still 1 − 0.2: 0.5 → −0.8 (clipped), 0.7 → −0.8 (clipped)
    assert surr.tolist() == pytest.approx([1.25, 1.28, -0.8, -0.8])
    assert clipped.tolist() == [False, True, True, True]
    symmetric, _ = ppo_clip_surrogate(ratio, adv, 0.2)
    assert symmetric.tolist() == pytest.approx([1.2, 1.2, -0.8, -0.8])


def test_policy_loss_takes_clip_higher_from_the_config() -> None:
    behav = t(-1.0)
    for high, expect_grad in ((None, 0.0), (0.28, -1.25)):
        logp = (torch.tensor([[1.25]]).log() + behav).requires_grad_()
        cfg = LossConfig(decoupled=False, clip_eps=0.2, clip_eps_high=high)
        out = policy_loss(logp, behav, t(1.0), t(1), cfg, total_tokens=1)
        out.loss.backward()
        # ratio 1.25 with A > 0: clipped (no gradient) at 1 + 0.2, free under 1 + 0.28
        assert logp.grad.item() == pytest.approx(expect_grad, abs=1e-6)
        assert out.metrics["clip_frac"] == (1.0 if high is None else 0.0)


def test_plain_ppo_ratio_is_against_behaviour_and_clipped_tokens_get_no_gradient() -> None:
    behav = t(-1.0, -2.0, -0.5, -3.0)
    ratios = [1.1, 1.5, 0.5, 0.5]
    logp = (torch.tensor([ratios]).log() + behav).requires_grad_()
    adv = t(1.0, 1.0, -1.0, -1.0)
    mask = t(1, 1, 1, 0)  # the last token is padding: ignored entirely
    cfg = LossConfig(decoupled=False, clip_eps=0.2, tis_cap=2.0)
    out = policy_loss(logp, behav, adv, mask, cfg, total_tokens=3)
    # surrogates 1.1, 1.2 (clipped), −0.8 (clipped) → loss −(1.1 + 1.2 − 0.8)/3
    assert out.loss.item() == pytest.approx(-(1.1 + 1.2 - 0.8) / 3, abs=1e-6)
    assert out.metrics["clip_frac"] == pytest.approx(2 / 3)
    assert out.metrics["is_truncated_frac"] == 0.0  # no extra weight without decoupling
    out.loss.backward()
    # d/dlogp of −ratio·A/3 = −ratio·A/3 where unclipped, 0 where clipped or masked
    assert logp.grad.tolist()[0] == pytest.approx([-1.1 / 3, 0.0, 0.0, 0.0], abs=1e-6)


def test_decoupled_uses_the_detached_current_policy_as_proximal_and_truncates_the_is_weight() -> None:
    logp = t(-1.0, -1.0).requires_grad_()
    behav = t(-1.0 - LN(3.0), -1.0 + LN(2.0))  # π_prox/π_behav = 3 (above the cap) and 0.5
    adv = t(1.0, 1.0)
    mask = t(1, 1)
    out = policy_loss(logp, behav, adv, mask, LossConfig(decoupled=True, tis_cap=2.0), total_tokens=2)
    # ratio π/π_prox = 1 (never clipped); weights min(3, 2) = 2 and 0.5 → loss −(2 + 0.5)/2
    assert out.loss.item() == pytest.approx(-1.25, abs=1e-6)
    assert out.metrics["clip_frac"] == 0.0
    assert out.metrics["is_weight_mean"] == pytest.approx(1.25, abs=1e-6)
    assert out.metrics["is_truncated_frac"] == pytest.approx(0.5)
    assert out.metrics["logprob_diff_behav"] == pytest.approx((LN(3.0) + LN(2.0)) / 2, abs=1e-6)
    out.loss.backward()
    assert logp.grad.tolist()[0] == pytest.approx([-1.0, -0.25], abs=1e-6)  # −w·A/N: the weight is detached

    untruncated = policy_loss(logp, behav, adv, mask, LossConfig(decoupled=True, tis_cap=None), total_tokens=2)
    assert untruncated.loss.item() == pytest.approx(-(3.0 + 0.5) / 2, abs=1e-5)
    assert untruncated.metrics["is_truncated_frac"] == 0.0


def test_decoupled_clips_against_an_explicit_proximal_policy() -> None:
    prox = t(-1.0, -1.0)
    logp = (prox + torch.tensor([[LN(1.5), LN(0.5)]])).requires_grad_()  # ratios 1.5 and 0.5 vs π_prox
    behav = prox.clone()  # w = 1
    adv = t(1.0, -1.0)
    out = policy_loss(logp, behav, adv, t(1, 1), LossConfig(decoupled=True), total_tokens=2, logp_prox=prox)
    assert out.loss.item() == pytest.approx(-(1.2 - 0.8) / 2, abs=1e-6)  # both clipped
    assert out.metrics["clip_frac"] == pytest.approx(1.0)


def test_decoupled_and_plain_differ_on_stale_data() -> None:
    """Data sampled by a policy 3× less likely: plain PPO clips (no gradient), decoupled reweights (capped)."""
    logp = t(-1.0).requires_grad_()
    behav = t(-1.0 - LN(3.0))
    adv = t(1.0)
    plain = policy_loss(logp, behav, adv, t(1), LossConfig(decoupled=False), total_tokens=1)
    plain.loss.backward()
    assert plain.loss.item() == pytest.approx(-1.2, abs=1e-6) and logp.grad.item() == 0.0
    logp.grad = None
    dec = policy_loss(logp, behav, adv, t(1), LossConfig(decoupled=True, tis_cap=2.0), total_tokens=1)
    dec.loss.backward()
    assert dec.loss.item() == pytest.approx(-2.0, abs=1e-6) and logp.grad.item() == pytest.approx(-2.0)


# ---- KL, entropy, logprobs ---------------------------------------------------------------------


def test_k3_kl_by_hand_and_its_place_in_the_loss() -> None:
    logp, ref = t(LN(0.5), LN(0.3)), t(LN(0.25), LN(0.3))
    # d = ref − logp = log 0.5: e^d − d − 1 = 0.5 − log 0.5 − 1; equal policies give 0
    assert k3_kl(logp, ref).tolist()[0] == pytest.approx([0.5 - LN(0.5) - 1.0, 0.0], abs=1e-6)
    cfg = LossConfig(kl_coef=0.1)
    out = policy_loss(logp, logp, t(0.0, 0.0), t(1, 1), cfg, total_tokens=2, logp_ref=ref)
    kl = (0.5 - LN(0.5) - 1.0) / 2
    assert out.metrics["kl"] == pytest.approx(kl, abs=1e-6)
    assert out.loss.item() == pytest.approx(0.1 * kl, abs=1e-6)


def test_entropy_of_uniform_logits_is_log_vocab_and_the_bonus_lowers_the_loss() -> None:
    vocab = 7
    logits = torch.zeros(2, 3, vocab)
    ids = torch.tensor([[0, 3, 6], [1, 2, 5]])
    logp, ent = token_logprobs_and_entropy(logits, ids)
    assert ent[:, 1:].flatten().tolist() == pytest.approx([LN(vocab)] * 4, abs=1e-6)
    assert logp[:, 1:].flatten().tolist() == pytest.approx([-LN(vocab)] * 4, abs=1e-6)
    assert logp[:, 0].tolist() == [0.0, 0.0] and ent[:, 0].tolist() == [0.0, 0.0]  # nothing predicts token 0
    mask = torch.tensor([[0, 1, 1], [0, 0, 1]], dtype=torch.float32)
    out = policy_loss(logp, logp, torch.zeros(2), mask, LossConfig(entropy_coef=0.1), total_tokens=3, entropy=ent)
    assert out.metrics["entropy"] == pytest.approx(LN(vocab), abs=1e-6)
    assert out.loss.item() == pytest.approx(-0.1 * LN(vocab), abs=1e-6)


def test_the_bonus_acts_only_on_sequences_of_unsolved_groups_and_the_metric_stays_over_all() -> None:
    solved = in_unsolved_group([True, False, False, False, False], ["a", "a", "b", "b", "c"])
    assert solved == [False, False, True, True, True]  # one success solves its whole group
    with pytest.raises(ValueError, match="2 success flags but 1 group ids"):
        in_unsolved_group([True, False], ["a"])
    ent = torch.tensor([[0.0, 2.0, 2.0], [0.0, 0.0, 4.0]])
    logp = torch.zeros(2, 3)
    mask = torch.tensor([[0, 1, 1], [0, 0, 1]], dtype=torch.float32)
    out = policy_loss(
        logp,
        logp,
        torch.zeros(2),
        mask,
        LossConfig(entropy_coef=0.1),
        total_tokens=3,
        entropy=ent,
        bonus_weight=torch.tensor([0.0, 1.0]),
    )
    assert out.metrics["entropy"] == pytest.approx((2 + 2 + 4) / 3)  # every loss token
    assert out.loss.item() == pytest.approx(-0.1 * 4 / 3)  # only the second sequence's token


def test_token_logprobs_line_up_with_input_ids() -> None:
    logits = torch.full((1, 3, 4), -1e4)
    logits[0, 0, 2] = 0.0  # position 0 predicts token 2 for sure
    logits[0, 1, :] = 0.0  # position 1: uniform
    logp = token_logprobs(logits, torch.tensor([[1, 2, 3]]))
    assert logp.tolist()[0] == pytest.approx([0.0, 0.0, -LN(4)], abs=1e-5)


# ---- batches and gradient accumulation ---------------------------------------------------------


def _seqs() -> list[TrainSequence]:
    return [
        TrainSequence([1, 2, 3], [4, 5], [-1.0, -2.0], 1.5),
        TrainSequence([2], [6], [-0.5], -0.5),
        TrainSequence([3, 4, 5, 6], [7, 1, 2], [-1.0, -1.0, -3.0], 0.7),
        TrainSequence([1, 1], [2], [-2.0], -1.7),
    ]


def test_collate_pads_on_the_right_and_masks_only_completions() -> None:
    mb = collate(_seqs()[:2], pad_id=9)
    assert mb.input_ids.tolist() == [[1, 2, 3, 4, 5], [2, 6, 9, 9, 9]]
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert mb.completion_mask.tolist() == [[0, 0, 0, 1, 1], [0, 1, 0, 0, 0]]
    assert mb.behav_logprobs.tolist() == [[0, 0, 0, -1.0, -2.0], [0, -0.5, 0, 0, 0]]
    assert mb.advantages.tolist() == [1.5, -0.5] and mb.num_tokens == 3
    assert [b.input_ids.shape[0] for b in micro_batches(_seqs(), 3)] == [3, 1]


def test_loss_aggregations_by_hand() -> None:
    """Two sequences, of 1 and 3 loss tokens, each token's pg term −A (on-policy, w = 1): token_mean weighs
    the long one 3:1, seq_mean 1:1, constant (Dr. GRPO) sums over 2 sequences x constant_tokens."""
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([1.0, -2.0])
    logp = torch.zeros(2, 3)

    def pg(**cfg: object) -> float:
        return policy_loss(logp, logp, adv, mask, LossConfig(**cfg), total_tokens=4, total_sequences=2).metrics[
            "pg_loss"
        ]

    assert pg() == pytest.approx((-1.0 + 3 * 2.0) / 4)  # token_mean: (−A₁ + 3·−A₂) / 4 tokens
    assert pg(aggregation="seq_mean") == pytest.approx((-1.0 + 2.0) / 2)
    assert pg(aggregation="constant", constant_tokens=8) == pytest.approx((-1.0 + 3 * 2.0) / (2 * 8))
    weights = loss_token_weights(mask, LossConfig(aggregation="seq_mean"), 4, 2)
    assert weights.tolist() == [[0.5, 0.0, 0.0], [pytest.approx(1 / 6)] * 3]
    with pytest.raises(ValueError, match="total_sequences"):
        loss_token_weights(mask, LossConfig(aggregation="seq_mean"), 4, None)


def test_dr_grpo_advantages_keep_the_raw_difference_from_the_group_mean() -> None:
    assert grpo_advantages([1.0, 0.0, 0.0, 0.0], ["g"] * 4, normalize_std=False) == [0.75, -0.25, -0.25, -0.25]
    assert grpo_advantages([1.0, 0.0], ["g"] * 2)[0] == pytest.approx(1.0, abs=1e-5)  # std 0.5 divides


@pytest.mark.parametrize(
    ("decoupled", "aggregation"), [(True, "token_mean"), (False, "token_mean"), (True, "seq_mean"), (True, "constant")]
)
def test_gradient_accumulation_over_micro_batches_equals_one_batch(decoupled: bool, aggregation: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.Tanh(), torch.nn.Linear(8, 10))
    cfg = LossConfig(decoupled=decoupled, entropy_coef=0.01, clip_eps=0.2, aggregation=aggregation, constant_tokens=4)
    seqs = _seqs()
    total = sum(len(s.completion_ids) for s in seqs)

    def run(batches: list) -> tuple[list[torch.Tensor], dict[str, float]]:
        model.zero_grad()
        sums: dict[str, float] = {}
        for mb in batches:
            logp, ent = token_logprobs_and_entropy(model(mb.input_ids), mb.input_ids)
            out = policy_loss(
                logp,
                mb.behav_logprobs,
                mb.advantages,
                mb.completion_mask,
                cfg,
                total_tokens=total,
                total_sequences=len(seqs),
                entropy=ent,
            )
            out.loss.backward()
            for k, v in out.metrics.items():
                sums[k] = sums.get(k, 0.0) + v
        return [p.grad.clone() for p in model.parameters()], sums

    whole, m_whole = run([collate(seqs)])
    split, m_split = run(micro_batches(seqs, 2))
    for a, b in zip(whole, split):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert m_whole == pytest.approx(m_split, abs=1e-6)
    assert any(g.abs().sum() > 0 for g in whole)
