"""PPO mini-batches and epochs: the split, the proximal log-probs, and two updates checked by hand."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import torch

from rollart.activities.rl.batch import MicroBatch, TrainSequence
from rollart.activities.rl.losses import token_logprobs_and_entropy
from rollart.activities.training.policy import Policy, StepOutcome
from rollart.activities.training.precision import MasterWeights
from rollart.activities.training.ranks import OneProcess
from rollart.activities.training.updates import (
    SHRINKS_MAX,
    mini_batch_parts,
    ppo_updates,
    updates,
    with_proximal_logprobs,
)
from rollart.spec.config import JobSpec, LossConfig, TrainerConfig


class Bandit(Policy):
    """A context-free policy over 3 tokens (logits θ, the same at every position), stepped by plain SGD,
    so every update can be computed by hand."""

    pad_id = 0

    def __init__(self, lr: float) -> None:
        self.theta = torch.zeros(3, requires_grad=True)
        self.lr = lr

    def logprobs(
        self, mb: MicroBatch, *, entropy_grad: bool, actions: object = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert actions is None  # this policy's entropy is over its 3 tokens
        logits = self.theta.expand(*mb.input_ids.shape, 3)
        return token_logprobs_and_entropy(logits, mb.input_ids)

    def ref_logprobs(self, mb: MicroBatch) -> torch.Tensor:
        raise NotImplementedError

    def zero_grad(self) -> None:
        self.theta.grad = None

    def step(self, cfg: TrainerConfig) -> StepOutcome:
        grad = self.theta.grad if self.theta.grad is not None else torch.zeros(3)
        with torch.no_grad():
            self.theta -= self.lr * grad
        self.zero_grad()
        return StepOutcome(grad_norm=float(grad.norm()), applied=True)

    def hf_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        raise NotImplementedError

    def load_hf_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        raise NotImplementedError

    def save_checkpoint(self, root: Path, step: int) -> None:
        raise NotImplementedError

    def load_checkpoint(self, root: Path) -> int | None:
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def remember_weights(self) -> None:
        self._before = self.theta.detach().clone()

    def shrink_update(self, factor: float) -> None:
        with torch.no_grad():
            self.theta.sub_(self._before).mul_(factor).add_(self._before)

    def forget_weights(self) -> None:
        del self._before


def say_1(advantage: float = 1.0) -> TrainSequence:
    """Prompt token 0, completion token 1, sampled by the uniform policy (logprob log 1/3)."""
    return TrainSequence([0], [1], [math.log(1 / 3)], advantage)


def test_the_second_update_is_clipped_against_the_policy_before_the_first() -> None:
    """θ = 0: p(1) = 1/3. Update 1 (ratio 1, w 1, A 1, one token): ∇(−log p(1)) = p − e₁ = (1/3, −2/3, 1/3),
    so θ = −3 · that = (−1, 2, −1) and p(1) = e²/(e² + 2e⁻¹) ≈ 0.909. Update 2 on the same sample: the ratio
    against the proximal policy (θ = 0) is 0.909 / (1/3) ≈ 2.73 > 1 + ε with A > 0, so the clip binds and θ
    stays put; a third policy that ignored the proximal policy would have moved again."""
    bandit = Bandit(lr=3.0)
    cfg = TrainerConfig(mini_batches=2, micro_batch_size=1, loss=LossConfig(clip_eps=0.2, tis_cap=None))
    metrics, outcomes = ppo_updates(bandit, OneProcess(), [[say_1(), say_1()]], cfg, step=0)
    assert torch.allclose(bandit.theta.detach(), torch.tensor([-1.0, 2.0, -1.0]), atol=1e-6)
    assert outcomes[0].grad_norm == pytest.approx(math.sqrt(6) / 3, rel=1e-6)
    assert outcomes[1].grad_norm == 0.0
    assert metrics["clip_frac"] == pytest.approx(0.5)  # update 1: none, update 2: its one token
    p1 = math.exp(2) / (math.exp(2) + 2 * math.exp(-1))
    assert metrics["pg_loss"] == pytest.approx((-1.0 + -(1.2)) / 2, rel=1e-6)  # −w·min(r·A, clip(r)·A), averaged
    assert p1 / (1 / 3) > 1.2


def test_the_proximal_weight_corrects_stale_data_by_hand() -> None:
    """Behaviour logprob log(1/6) (a staler policy), proximal p = 1/3: w = 2, truncated at tis_cap 1.5, so the
    update is 1.5 · (p − e₁) = (0.5, −1, 0.5) and θ = −(0.5, −1, 0.5) at lr 1."""
    bandit = Bandit(lr=1.0)
    stale = TrainSequence([0], [1], [math.log(1 / 6)], 1.0)
    cfg = TrainerConfig(micro_batch_size=4, loss=LossConfig(tis_cap=1.5))
    metrics, outcomes = ppo_updates(bandit, OneProcess(), [[stale]], cfg, step=0)
    assert len(outcomes) == 1
    assert torch.allclose(bandit.theta.detach(), torch.tensor([-0.5, 1.0, -0.5]), atol=1e-6)
    assert metrics["is_weight_mean"] == pytest.approx(1.5) and metrics["is_truncated_frac"] == 1.0
    assert metrics["logprob_diff_behav"] == pytest.approx(math.log(2), rel=1e-6)


def test_with_proximal_logprobs_are_the_policys_own_in_the_original_order() -> None:
    bandit = Bandit(lr=1.0)
    with torch.no_grad():
        bandit.theta.copy_(torch.tensor([0.0, 1.0, 2.0]))
    seqs = [TrainSequence([0, 0], [2, 1], [0.0, 0.0], 1.0), TrainSequence([0], [1], [0.0], 1.0)]
    out = with_proximal_logprobs(bandit, seqs, micro_batch_size=1)
    logp = torch.log_softmax(torch.tensor([0.0, 1.0, 2.0]), -1)
    assert out[0].prox_logprobs == pytest.approx([float(logp[2]), float(logp[1])])
    assert out[1].prox_logprobs == pytest.approx([float(logp[1])])
    assert [s.completion_ids for s in out] == [[2, 1], [1]]


def test_mini_batch_parts_cover_each_share_once_in_balanced_parts() -> None:
    parts = mini_batch_parts([10, 7], 3, seed=5)
    for size, share_parts in zip([10, 7], parts):
        assert sorted(i for p in share_parts for i in p) == list(range(size))
        assert max(map(len, share_parts)) - min(map(len, share_parts)) <= 1
    assert mini_batch_parts([10, 7], 3, seed=6) != parts  # each epoch reshuffles
    capped = mini_batch_parts([4, 2, 0], 3, seed=0)  # at most the smallest non-empty share's size
    assert [len(p) for p in capped] == [2, 2, 2] and capped[2] == [[], []]


def test_several_updates_step_the_optimizer_that_many_times() -> None:
    bandit = Bandit(lr=0.1)
    cfg = TrainerConfig(mini_batches=2, ppo_epochs=3, micro_batch_size=2)
    _, outcomes = ppo_updates(bandit, OneProcess(), [[say_1(), say_1(-1.0), say_1(0.5), say_1(1.0)]], cfg, step=3)
    assert len(outcomes) == 6 and all(o.applied for o in outcomes)


def test_more_mini_batches_than_a_batch_holds_is_refused() -> None:
    with pytest.raises(ValueError, match=r"trainer.mini_batches \(16\) is more than training.batch_size \(8\)"):
        JobSpec.model_validate(
            {
                "tasks": [{"name": "t", "env": "frozenlake", "reward": "success"}],
                "training": {"batch_size": 8},
                "trainer": {"mini_batches": 16},
            }
        )


def test_an_update_past_the_logprob_limit_is_halved_until_within_it() -> None:
    """lr 3 moves p(1) from 1/3 to 0.909 in one update: |Δ log p| = log 2.73 = 1.00 nats. With the limit at 0.5
    it is halved: θ = (−0.5, 1, −0.5) gives p(1) = 0.691, still 0.73 nats; halved again, θ = (−0.25, 0.5, −0.25)
    gives p(1) = 0.514, 0.43 nats: within. Without the limit the whole update stays."""
    cfg = TrainerConfig(micro_batch_size=4, loss=LossConfig(tis_cap=None))
    free = Bandit(lr=3.0)
    _, (outcome,) = updates(free, OneProcess(), [say_1()], 1, cfg, step=0)
    assert torch.allclose(free.theta.detach(), torch.tensor([-1.0, 2.0, -1.0]), atol=1e-6)
    assert outcome.logprob_change is None and outcome.shrinks == 0

    limited = Bandit(lr=3.0)
    _, (outcome,) = updates(limited, OneProcess(), [say_1()], 1, cfg.model_copy(update={"max_logprob_change": 0.5}), 0)
    assert torch.allclose(limited.theta.detach(), torch.tensor([-0.25, 0.5, -0.25]), atol=1e-6)
    p1 = math.exp(0.5) / (math.exp(0.5) + 2 * math.exp(-0.25))
    assert outcome.shrinks == 2 and outcome.logprob_change == pytest.approx(math.log(3 * p1), rel=1e-6)


def test_the_limit_gives_up_after_its_halvings_and_spares_small_updates() -> None:
    tiny = TrainerConfig(micro_batch_size=4, max_logprob_change=1e-9, loss=LossConfig(tis_cap=None))
    bandit = Bandit(lr=3.0)
    _, (outcome,) = updates(bandit, OneProcess(), [say_1()], 1, tiny, step=0)
    assert outcome.shrinks == SHRINKS_MAX  # 1/64 of the update is left, and said
    assert torch.allclose(bandit.theta.detach(), torch.tensor([-1.0, 2.0, -1.0]) / 2**SHRINKS_MAX, atol=1e-6)
    small = Bandit(lr=0.01)
    _, (outcome,) = updates(small, OneProcess(), [say_1()], 1, tiny.model_copy(update={"max_logprob_change": 0.5}), 0)
    assert outcome.shrinks == 0 and 0 < (outcome.logprob_change or 0) < 0.01


def test_master_weights_shrink_an_update_in_the_masters_and_the_bf16_model() -> None:
    """A bf16 model's update is scaled in its fp32 masters, then copied into the model."""
    model = torch.nn.Linear(4, 4, bias=False).to(torch.bfloat16)
    opt = MasterWeights(list(model.parameters()), TrainerConfig(lr=0.1))
    before = opt.masters[0].detach().clone()
    opt.remember()
    opt.step([torch.ones(4, 4, dtype=torch.bfloat16)], TrainerConfig(lr=0.1))
    full = opt.masters[0].detach().clone()
    opt.shrink(0.25)
    assert torch.allclose(opt.masters[0], before + 0.25 * (full - before), atol=1e-7)
    assert torch.equal(model.weight, opt.masters[0].to(torch.bfloat16))
    opt.forget()
    assert opt._before == []  # the copy is not kept between steps
