"""Packed micro-batches (`trainer.packing`): the packing logic, and both backends' packed path against their padded
one on the same weights and a mixed-length batch (log-probs, loss, gradients), through `train_step` too."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from temporalio.testing import ActivityEnvironment
from transformers import AutoTokenizer

from rollart.activities.rl.action_entropy import ActionSpace, ActionTerm
from rollart.activities.rl.batch import TrainSequence, collate, micro_batch_indices, pack
from rollart.activities.rl.packing import pack_indices, packed_inputs
from rollart.activities.training.packed_attention import VARLEN_SDPA
from rollart.activities.training.torch_policy import TorchPolicy
from rollart.activities.training.updates import accumulate_gradients, with_proximal_logprobs
from rollart.spec.config import LossConfig, TrainerConfig
from tests.support.gloo import run_on_ranks
from tests.test_megatron_backend import build_model

CPU = torch.device("cpu")
VOCAB = 387


def mixed(seed: int = 0, n: int = 9) -> list[TrainSequence]:
    """Sequences of 2 to ~40 tokens (one with a single prompt token), made-up behaviour log-probs, two tasks."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [rng.randrange(1, VOCAB) for _ in range(1 if i == 0 else rng.randint(2, 30))]
        completion = [rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 10))]
        behav = [-6.0 + rng.random() for _ in completion]
        out.append(TrainSequence(prompt, completion, behav, rng.choice([-1.0, 0.5, 1.2]), task="tu"[i % 2]))
    return out


def with_packing(cfg: TrainerConfig, max_tokens: int) -> TrainerConfig:
    return TrainerConfig.model_validate({**cfg.model_dump(), "packing": {"max_tokens": max_tokens}})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("packing") / "qwen2")


# --- the packing logic -----------------------------------------------------------------------------------------


def test_bins_keep_every_sequence_whole_once_within_the_budget() -> None:
    rng = random.Random(3)
    lengths = [rng.randint(1, 90) for _ in range(60)] + [150, 300]
    bins = pack_indices(lengths, 100)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    for b in bins:
        assert len(b) == 1 or sum(lengths[i] for i in b) <= 100, b  # over budget only alone
    assert [62 - 1] in bins and [62 - 2] in bins  # the two longer than the budget, each alone
    assert len(bins) <= sum(lengths) // 100 + 4  # first-fit decreasing wastes little
    assert pack_indices(lengths, 100) == bins  # deterministic


def test_positions_restart_per_sequence_and_unpacking_lays_values_out_as_collate() -> None:
    p = packed_inputs([[5, 6, 7], [8], [9, 10]])
    assert p.input_ids.tolist() == [[5, 6, 7, 8, 9, 10]]
    assert p.position_ids.tolist() == [[0, 1, 2, 0, 0, 1]]
    assert p.cu_seqlens.tolist() == [0, 3, 4, 6] and p.max_seqlen == 3
    mask = p.block_causal_mask()
    assert mask[2].tolist() == [True, True, True, False, False, False]
    assert mask[5].tolist() == [False, False, False, False, True, True]
    values = torch.arange(1.0, 7.0)[None]
    # position 0 of each sequence (predicted across a boundary) and the padding are 0
    assert p.unpack(values, 4).tolist() == [[0, 2, 3, 0], [0, 0, 0, 0], [0, 6, 0, 0]]


def test_a_packed_micro_batch_keeps_the_padded_loss_tensors() -> None:
    seqs = mixed()
    mb = pack(seqs, pad_id=0)
    ref = collate(seqs, pad_id=0)
    for name in ("input_ids", "attention_mask", "completion_mask", "behav_logprobs", "advantages", "bonus"):
        assert torch.equal(getattr(mb, name), getattr(ref, name)), name
    assert mb.packed is not None and mb.packed.num_tokens == sum(s.length for s in seqs)
    assert mb.model_ids.shape == (1, mb.packed.num_tokens)
    assert micro_batch_indices(seqs, 2, max_tokens=40) == pack_indices([s.length for s in seqs], 40)


# --- the torch backend -----------------------------------------------------------------------------------------


def logprob_gap(policy: TorchPolicy, seqs: list[TrainSequence], actions: ActionTerm | None = None) -> tuple:
    """Largest |padded − packed| of the log-probs and entropies over real positions; the packed values elsewhere."""
    padded, packed = collate(seqs, policy.pad_id), pack(seqs, policy.pad_id)
    with torch.no_grad():
        lp_a, ent_a = policy.logprobs(padded, entropy_grad=False, actions=actions)
        lp_b, ent_b = policy.logprobs(packed, entropy_grad=False, actions=actions)
    valid = padded.attention_mask.bool()
    valid[:, 0] = False
    rest = float(torch.cat([lp_b[~valid], ent_b[~valid]]).abs().max())
    return float((lp_a - lp_b)[valid].abs().max()), float((ent_a - ent_b)[valid].abs().max()), rest


@pytest.mark.parametrize("attention", [VARLEN_SDPA, "sdpa", "eager"])
def test_torch_packed_log_probs_equal_padded_ones(model_dir: Path, attention: str) -> None:
    policy = TorchPolicy(model_dir, TrainerConfig(packing={"max_tokens": 64}), CPU)
    assert policy.model.config._attn_implementation == VARLEN_SDPA  # what packing picks on a CPU
    policy.model.set_attn_implementation(attention)
    lp, ent, rest = logprob_gap(policy, mixed())
    assert lp < 1e-6 and ent < 1e-5 and rest == 0.0, (lp, ent, rest)
    plain = TorchPolicy(model_dir, TrainerConfig(), CPU)  # sdpa as loaded: padded rows read the same either way
    padded = collate(mixed(), plain.pad_id)
    with torch.no_grad():
        gap = policy.logprobs(padded, entropy_grad=False)[0] - plain.logprobs(padded, entropy_grad=False)[0]
    assert float((gap * padded.attention_mask).abs().max()) < 1e-6


def test_lora_packed_log_probs_and_reference_equal_padded_ones(model_dir: Path) -> None:
    policy = TorchPolicy(model_dir, TrainerConfig(lora={"rank": 4}, packing={"max_tokens": 64}), CPU)
    with torch.no_grad():
        for p in policy.params:  # adapters away from their zero start, so that the model and reference differ
            p.normal_(0, 0.05)
    lp, ent, _ = logprob_gap(policy, mixed())
    seqs = mixed()
    padded, packed = collate(seqs, policy.pad_id), pack(seqs, policy.pad_id)
    valid = padded.attention_mask.bool()
    valid[:, 0] = False
    ref_gap = (policy.ref_logprobs(padded) - policy.ref_logprobs(packed))[valid].abs().max()
    with torch.no_grad():
        moved = (policy.logprobs(padded, entropy_grad=False)[0] - policy.ref_logprobs(padded))[valid].abs().max()
    assert lp < 1e-6 and ent < 1e-5 and float(ref_gap) < 1e-6 and float(moved) > 1e-3, (lp, ent, ref_gap, moved)


def test_what_comes_before_a_packed_sequence_never_reaches_it(model_dir: Path) -> None:
    """The attention stays within each sequence and the first position (read across the boundary) is 0: changing
    every token of the first sequence changes nothing of the second's log-probs."""
    policy = TorchPolicy(model_dir, TrainerConfig(), CPU)
    first, second = mixed()[1:3]
    other = replace(first, prompt_ids=[(t + 7) % VOCAB for t in first.prompt_ids])
    with torch.no_grad():
        a = policy.logprobs(pack([first, second]), entropy_grad=False)[0][1]
        b = policy.logprobs(pack([other, second]), entropy_grad=False)[0][1]
    assert float((a - b).abs().max()) < 1e-6 and a[0] == 0.0 and float(a.abs().max()) > 1.0


def loss_and_grads(model_dir: Path, seqs: list[TrainSequence], cfg: TrainerConfig, actions=None) -> tuple:
    policy = TorchPolicy(model_dir, cfg, CPU)
    total = sum(s.loss_tokens for s in seqs)
    metrics = accumulate_gradients(policy, seqs, total, cfg, len(seqs), actions)
    return metrics, {n: p.grad.clone() for n, p in policy.model.named_parameters()}


ACTIONS = ActionTerm(
    {"t": ActionSpace(tuple("abcd"), torch.arange(VOCAB) % 5), "u": ActionSpace(tuple("xyz"), torch.arange(VOCAB) % 3)}
)

LOSSES = {
    "token_mean": LossConfig(),
    "seq_mean, bonus per sequence, kl": LossConfig(aggregation="seq_mean", entropy_coef=0.01, kl_coef=0.1),
    "entropy over 2 tasks' actions": LossConfig(entropy_coef=0.05, entropy_over="actions"),
}


@pytest.mark.parametrize("case", list(LOSSES))
def test_torch_packed_loss_and_gradients_equal_padded_ones(model_dir: Path, case: str) -> None:
    seqs = [replace(s, bonus=float(i % 3 > 0)) for i, s in enumerate(mixed(n=11))]
    loss = LOSSES[case]
    actions = ACTIONS if loss.entropy_over == "actions" else None
    padded = TrainerConfig(micro_batch_size=3, loss=loss)
    m_a, g_a = loss_and_grads(model_dir, seqs, padded, actions)
    m_b, g_b = loss_and_grads(model_dir, seqs, with_packing(padded, 48), actions)
    assert abs(m_a["loss"] - m_b["loss"]) < 1e-6, (m_a, m_b)
    if case == "token_mean":  # other bins, another order: the same loss
        shuffled = random.Random(1).sample(seqs, len(seqs))
        m_c, _ = loss_and_grads(model_dir, shuffled, with_packing(padded, 80), actions)
        assert abs(m_a["loss"] - m_c["loss"]) < 1e-6, (m_a, m_c)
    assert abs(m_a["entropy"] - m_b["entropy"]) < 1e-6 and abs(m_a["loss"]) > 1e-3
    assert max(float((g_a[k] - g_b[k]).abs().max()) for k in g_a) < 1e-6
    assert max(float(g.abs().max()) for g in g_a.values()) > 1e-3  # the gradients are not all ~0


def test_proximal_log_probs_are_the_same_packed(model_dir: Path) -> None:
    policy = TorchPolicy(model_dir, TrainerConfig(), CPU)
    seqs = mixed()
    padded = with_proximal_logprobs(policy, seqs, 2)
    packed = with_proximal_logprobs(policy, seqs, 2, max_tokens=40)
    assert max(abs(x - y) for a, b in zip(padded, packed) for x, y in zip(a.prox_logprobs, b.prox_logprobs)) < 1e-6


# --- the megatron backend --------------------------------------------------------------------------------------


def megatron_packed_vs_padded(model_dir: str, seqs: list[TrainSequence]) -> dict[str, float] | None:
    """On each rank: log-probs, loss and gradients of the megatron backend, padded against packed; the
    differences on the leader (None on the others)."""
    from rollart.activities.training.megatron.policy import MegatronPolicy

    padded = TrainerConfig(backend="megatron", micro_batch_size=3, loss=LossConfig(entropy_coef=0.01, kl_coef=0.1))
    packed = with_packing(padded, 48)
    policy = MegatronPolicy(model_dir, padded, CPU)
    with torch.no_grad():
        lp_a, ent_a = policy.logprobs(collate(seqs, policy.pad_id), entropy_grad=False)
        lp_b, ent_b = policy.logprobs(pack(seqs, policy.pad_id), entropy_grad=False)
    valid = collate(seqs).attention_mask.bool()
    valid[:, 0] = False
    total = sum(s.loss_tokens for s in seqs)
    out = {"logprob": float((lp_a - lp_b)[valid].abs().max()), "entropy": float((ent_a - ent_b)[valid].abs().max())}
    grads = []
    for cfg in (padded, packed):
        out[f"loss {cfg.packing is not None}"] = accumulate_gradients(policy, seqs, total, cfg)["loss"]
        policy.sync_grads()
        grads.append(policy.gathered_hf(grads=True))
        policy.zero_grad()
    if grads[0] is None:
        return None
    out["grad"] = max(float((grads[0][k] - grads[1][k]).abs().max()) for k in grads[0])
    out["grad_max"] = max(float(g.abs().max()) for g in grads[0].values())
    return out


@pytest.mark.integration
@pytest.mark.parametrize("tensor", [1, 2])
def test_megatron_packed_equals_padded(model_dir: Path, tensor: int) -> None:
    """T=1, and T=2 (each rank's vocabulary slice and heads of the packed row)."""
    d = run_on_ranks(megatron_packed_vs_padded, tensor, tensor, str(model_dir), mixed(n=11))[0]
    assert d["logprob"] < 1e-6 and d["entropy"] < 1e-5, d
    assert abs(d["loss True"] - d["loss False"]) < 1e-6 and d["grad"] < 1e-6 and d["grad_max"] > 1e-3, d


# --- a train step ----------------------------------------------------------------------------------------------


async def test_a_train_step_packed_equals_one_padded(tiny_model: Path, tmp_path: Path) -> None:
    from rollart.activities.trainer import TrainerActivities
    from rollart.contracts.activities import TrainStepInput
    from rollart.infra.store.payload import LocalStore
    from rollart.infra.store.weight_stream import read_all
    from rollart.infra.store.weights import read_manifest
    from tests.support.batches import JOB, frozenlake_batch, load_model

    store = LocalStore(tmp_path / "store")
    samples = frozenlake_batch(store, load_model(tiny_model), AutoTokenizer.from_pretrained(tiny_model))
    out = {}
    for name, packing in (("padded", None), ("packed", {"max_tokens": 100})):
        cfg = TrainerConfig(micro_batch_size=4, eps=1e-6, packing=packing, max_logprob_change=5.0)
        inp = TrainStepInput(
            job_id=f"{JOB}-{name}",
            step=0,
            samples=samples,
            model_dir=str(tiny_model),
            run_dir=str(tmp_path / name),
            trainer=cfg,
        )
        result = await ActivityEnvironment().run(TrainerActivities(store).train_step, inp)
        out[name] = (result.metrics, read_all(store, read_manifest(store, result.weights_key)))
    (m_a, w_a), (m_b, w_b) = out["padded"], out["packed"]
    assert abs(m_a["loss"] - m_b["loss"]) < 1e-6 and abs(m_a["loss"]) > 0
    assert abs(m_a["grad_norm"] - m_b["grad_norm"]) < 1e-6 * m_a["grad_norm"], (m_a, m_b)
    assert max(float((w_a[k].float() - w_b[k].float()).abs().max()) for k in w_a) < 1e-5
