"""The megatron backend against the torch backend: weight conversion, log-probs, gradients, one AdamW step.

Conversion is checked in one process (pure tensor functions). Numerics run the real step code
(`activities.training.updates.accumulate_gradients`, the policies' `step`) on 2 gloo ranks, once with tensor
parallelism (T=2) and once with data parallelism (D=2), against the torch backend on the same HF
weights and batch. The model is a small Qwen2 with perturbed biases and norms (so their mapping is
exercised) and an odd vocabulary (387: padded to 388 at T=2, the padding masked), and a small Qwen3 (qk-norm,
a head dim of twice hidden/heads) alike.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rollart.activities.rl.action_entropy import ActionSpace, ActionTerm
from rollart.activities.rl.batch import TrainSequence, collate
from rollart.activities.training.megatron.convert import hf_to_megatron, megatron_to_hf
from rollart.activities.training.megatron.hf_layout import HfArch, UnsupportedModel
from rollart.spec.config import LossConfig, TrainerConfig
from tests.support.gloo import run_on_ranks

BASE = {
    "vocab_size": 387,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "pad_token_id": 0,
}


QWEN3 = {"model_type": "qwen3", "head_dim": 32}
"""A Qwen3 of BASE's sizes whose heads are twice hidden/heads wide (as Qwen3-0.6B's: 128 against 1024/16)."""


def build_model(out: Path, model_type: str = "qwen2", **overrides: object) -> Path:
    """A random Qwen2 (or Qwen3) saved as safetensors; biases and norm weights (q/k norms too) perturbed away
    from 0 and 1."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    config_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}[
        model_type
    ]
    torch.manual_seed(0)
    model = model_cls(config_cls(**{**BASE, **overrides}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
            elif "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    model.save_pretrained(out)
    return out


def hf_state(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


@pytest.mark.parametrize(
    ("variant", "overrides", "tp"),
    [
        ("untied GQA", {}, 2),
        ("tied", {"tie_word_embeddings": True}, 2),
        ("4 ranks", {}, 4),
        ("MQA: 1 kv head < tp", {"num_key_value_heads": 1}, 2),
        ("one rank", {}, 1),
        ("Qwen3 qk-norm, wide heads", QWEN3, 2),
        ("Qwen3 tied, one rank", {**QWEN3, "tie_word_embeddings": True}, 1),
        ("Qwen3 MQA: 1 kv head < tp", {**QWEN3, "num_key_value_heads": 1}, 2),
    ],
)
def test_hf_to_megatron_to_hf_round_trips_exactly(tmp_path: Path, variant: str, overrides: dict, tp: int) -> None:
    model_dir = build_model(tmp_path / "m", **overrides)
    arch = HfArch.from_model_dir(model_dir)
    hf = hf_state(model_dir)
    shards = [hf_to_megatron(hf.__getitem__, arch, tp, r) for r in range(tp)]
    assert shards[0]["embedding.word_embeddings.weight"].shape[0] == arch.padded_vocab(tp) // tp
    back = megatron_to_hf({k: [s[k] for s in shards] for k in shards[0]}, arch)
    expected = {k: v for k, v in hf.items() if not (arch.tie_word_embeddings and k == "lm_head.weight")}
    assert set(back) == set(expected), variant
    assert all(torch.equal(back[k], expected[k]) for k in expected), variant


def test_the_vocabulary_is_padded_with_zero_rows_to_a_multiple_of_tp(tmp_path: Path) -> None:
    arch = HfArch.from_model_dir(build_model(tmp_path / "m"))
    hf = hf_state(tmp_path / "m")
    last = hf_to_megatron(hf.__getitem__, arch, 2, 1)["output_layer.weight"]
    assert arch.padded_vocab(2) == 388 and last.shape[0] == 194 and torch.equal(last[-1], torch.zeros(64))


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"model_type": "gemma"}, "model_type 'gemma' is not supported"),
        ({"model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope scaling"),
        ({"model_type": "llama", "attention_bias": True}, "attention_bias"),
        ({"model_type": "qwen2", "hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"model_type": "qwen2_moe", "num_experts": 8}, "qwen2_moe' is not supported .*mixture-of-experts"),
        ({"model_type": "qwen3", "attention_bias": True}, "attention_bias"),
        ({"model_type": "qwen3", "layer_types": ["sliding_attention"]}, "sliding-window"),
    ],
)
def test_unsupported_architectures_fail_at_load_saying_why(config: dict, message: str) -> None:
    c = {
        "num_attention_heads": 4,
        "hidden_size": 64,
        "vocab_size": 10,
        "intermediate_size": 8,
        "num_hidden_layers": 1,
        **config,
    }
    with pytest.raises(UnsupportedModel, match=message):
        HfArch.from_config(c)


def test_qwen3_is_read_with_qk_norm_no_qkv_bias_and_its_own_head_dim() -> None:
    arch = HfArch.from_config({**BASE, **QWEN3})
    assert (arch.qk_norm, arch.qkv_bias, arch.head_dim) == (True, False, 32)
    qwen2 = HfArch.from_config({**BASE, "model_type": "qwen2"})
    assert (qwen2.qk_norm, qwen2.qkv_bias) == (False, True)


def test_tensor_parallel_sizes_that_do_not_split_the_heads_are_refused() -> None:
    arch = HfArch.from_config(
        {
            "model_type": "qwen2",
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "hidden_size": 64,
            "vocab_size": 10,
            "intermediate_size": 8,
            "num_hidden_layers": 1,
        }
    )
    arch.check_tensor_parallel(2)
    with pytest.raises(UnsupportedModel, match="does not divide the model's 4 attention heads"):
        arch.check_tensor_parallel(3)


def batch(seed: int = 0, n: int = 6, vocab: int = 387) -> list[TrainSequence]:
    """Sequences of varied length; behaviour log-probs are filled in later from the model (plus noise)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        completion = [rng.randrange(vocab) for _ in range(rng.randint(1, 5))]
        out.append(
            TrainSequence(
                [rng.randrange(vocab) for _ in range(rng.randint(3, 9))],
                completion,
                [0.0] * len(completion),
                rng.choice([-1.0, 0.5, 1.2]),
            )
        )
    return out


def both_backends(model_dir: str, cfg_json: str) -> tuple:
    """On a rank: the config, the rank's view, and the torch and megatron backends built from the same weights."""
    from rollart.activities.training.megatron.policy import MegatronPolicy
    from rollart.activities.training.ranks import DistributedRanks
    from rollart.activities.training.torch_policy import TorchPolicy

    cpu = torch.device("cpu")
    cfg = TrainerConfig.model_validate_json(cfg_json)
    return cfg, DistributedRanks(cpu), TorchPolicy(model_dir, cfg, cpu), MegatronPolicy(model_dir, cfg, cpu)


def with_behaviour_logprobs(ref, seqs: list[TrainSequence]) -> list[TrainSequence]:
    """Behaviour log-probs: the model's own, perturbed so importance weights are not all 1."""
    with torch.no_grad():
        lp, _ = ref.logprobs(collate(seqs, ref.pad_id), entropy_grad=False)
    gen = torch.Generator().manual_seed(1)
    return [
        TrainSequence(
            s.prompt_ids,
            s.completion_ids,
            (lp[i, len(s.prompt_ids) : s.length] + 0.05 * torch.randn(len(s.completion_ids), generator=gen)).tolist(),
            s.advantage,
        )
        for i, s in enumerate(seqs)
    ]


def compare_with_torch(
    model_dir: str, seqs: list[TrainSequence], cfg_json: str, actions: ActionTerm | None = None
) -> dict[str, float] | None:
    """On each rank: the torch backend (whole batch) and the megatron backend (its data-parallel share) take one
    step from the same weights; the leader returns the largest differences. With `actions` the entropy is over
    actions (every sequence of task "t" when there is one such space, else alternating tasks)."""
    from rollart.activities.training.updates import accumulate_gradients, data_shard

    cfg, ranks, ref, meg = both_backends(model_dir, cfg_json)
    seqs = with_behaviour_logprobs(ref, seqs)
    if actions:
        names = sorted(actions.spaces)
        seqs = [replace(s, task=names[i % len(names)]) for i, s in enumerate(seqs)]
    whole = collate(seqs, ref.pad_id)
    valid = whole.attention_mask.bool()
    valid[:, 0] = False
    with torch.no_grad():
        lp_t, ent_t = ref.logprobs(whole, entropy_grad=False, actions=actions)
        lp_m, ent_m = meg.logprobs(whole, entropy_grad=False, actions=actions)
    total = sum(len(s.completion_ids) for s in seqs)
    m_t = accumulate_gradients(ref, seqs, total, cfg, actions=actions)
    m_m = ranks.sum_over_data(
        accumulate_gradients(meg, data_shard(seqs, ranks.data_rank, ranks.data_size), total, cfg, actions=actions)
    )
    meg.sync_grads()
    grads_m = meg.gathered_hf(grads=True)
    grads_t = {n: p.grad.clone() for n, p in ref.model.named_parameters()}
    norm_t = ref.step(cfg).grad_norm
    norm_m = meg.step(cfg).grad_norm
    weights_m = meg.gathered_hf()
    if not ranks.is_leader:
        return None
    weights_t = ref.model.state_dict()
    return {
        "logprob": float((lp_t - lp_m)[valid].abs().max()),
        "entropy": float((ent_t - ent_m)[valid].abs().max()),
        "loss": abs(m_t["loss"] - m_m["loss"]),
        "grad": max(float((grads_t[k] - g).abs().max()) for k, g in grads_m.items()),
        "grad_max": max(float(g.abs().max()) for g in grads_m.values()),
        "weights": max(float((weights_t[k] - w).abs().max()) for k, w in weights_m.items()),
        "grad_norm": abs(norm_t - norm_m) / norm_t,
        "names_match": float(set(grads_m) == set(grads_t) and set(weights_m) <= set(weights_t)),
    }


BONUS_AND_KL = LossConfig(entropy_coef=0.01, kl_coef=0.1, decoupled=False)
ACTION_BONUS = LossConfig(entropy_coef=0.05, entropy_over="actions")
COVERAGE_BONUS = LossConfig(entropy_coef=0.05, entropy_over="actions", action_bonus="coverage")


def action_term(form: str) -> ActionTerm:
    """Two tasks reading the 387 tokens as actions differently: id % 5 (4 actions and none), id % 3 (3 actions)."""
    return ActionTerm(
        {"t": ActionSpace(tuple("abcd"), torch.arange(387) % 5), "u": ActionSpace(tuple("xyz"), torch.arange(387) % 3)},
        form,
    )


COMPARISONS: dict[str, tuple[int, int, LossConfig, int]] = {  # tensor, data, loss, sequences
    "T2": (2, 1, LossConfig(), 6),
    "D2": (1, 2, LossConfig(), 6),
    "T2-qwen3": (2, 1, LossConfig(), 6),  # the Qwen3 model (QWEN3) where the name says so, else the Qwen2
    "D2-qwen3": (1, 2, LossConfig(), 6),
    "T2-entropy-kl": (2, 1, BONUS_AND_KL, 6),
    "D2-entropy-kl": (1, 2, BONUS_AND_KL, 6),
    "D2-one-sequence": (1, 2, LossConfig(), 1),  # data rank 1 has nothing to train on and still joins the sum
    "T2-action-entropy": (2, 1, ACTION_BONUS, 6),
    "T2-coverage": (2, 1, COVERAGE_BONUS, 6),  # over actions from each rank's vocabulary slice, 2 tasks
}


def compare_cases(cases: list[tuple[str, str, str, int, str | None]]) -> dict[str, dict] | None:
    """On each rank: `compare_with_torch` for every case (name, model dir, trainer config, sequences, action
    bonus form)."""
    out = {
        name: compare_with_torch(model_dir, batch(n=n), cfg_json, action_term(form) if form else None)
        for name, model_dir, cfg_json, n, form in cases
    }
    return out if out and next(iter(out.values())) is not None else None


@pytest.fixture(scope="module")
def comparisons(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Every case of COMPARISONS, one launch of ranks per layout (a launch costs more than a case)."""
    out: dict[str, dict] = {}
    for tensor, data in ((2, 1), (1, 2)):
        root = tmp_path_factory.mktemp(f"t{tensor}d{data}")
        tied = tensor == 2
        models = {
            "qwen2": build_model(root / "qwen2", tie_word_embeddings=tied),
            "qwen3": build_model(root / "qwen3", **{**QWEN3, "tie_word_embeddings": tied}),
        }
        cases = []
        for name, (t, d, loss, n) in COMPARISONS.items():
            if (t, d) == (tensor, data):
                cfg = TrainerConfig(
                    backend="megatron", parallel={"tensor": t, "data": d}, eps=1e-6, micro_batch_size=2, loss=loss
                )
                form = loss.action_bonus if loss.entropy_over == "actions" else None
                model_dir = models["qwen3" if name.endswith("qwen3") else "qwen2"]
                cases.append((name, str(model_dir), cfg.model_dump_json(), n, form))
        out.update(run_on_ranks(compare_cases, tensor * data, tensor, cases)[0])
    return out


@pytest.mark.integration
@pytest.mark.parametrize("case", list(COMPARISONS))
def test_megatron_equals_torch_on_the_same_weights_and_batch(comparisons: dict[str, dict], case: str) -> None:
    """Log-probs within 1e-4, gradients within 1e-6, and with AdamW eps 1e-6 one step leaves the weights within 1e-5
    (with eps 1e-8, rounding noise on near-zero gradients becomes full-size updates)."""
    d = comparisons[case]
    print(f"{case}: {json.dumps(d)}")
    assert d["names_match"] == 1.0
    assert d["logprob"] < 1e-4 and d["entropy"] < 1e-4 and d["loss"] < 1e-6, d
    assert d["grad"] < 1e-6 and d["grad_max"] > 1e-3 and d["grad_norm"] < 1e-6, d  # the gradients are not all ~0
    assert d["weights"] < 1e-5, d


def test_data_parallel_shares_are_disjoint_cover_the_batch_and_balance_tokens() -> None:
    from rollart.activities.training.updates import data_shard

    seqs = batch(n=37)
    for size in (1, 2, 3, 8):
        shares = [data_shard(seqs, r, size) for r in range(size)]
        ids = [id(s) for share in shares for s in share]
        assert sorted(ids) == sorted(id(s) for s in seqs) and len(set(ids)) == len(seqs)
        tokens = [sum(s.length for s in share) for share in shares]
        assert max(tokens) - min(tokens) <= max(s.length for s in seqs)  # greedy: within one sequence
    assert data_shard(seqs[:1], 1, 2) == []  # a rank may get nothing; it still joins the gradient sum


def precision_and_recompute(model_dir: str, seqs: list[TrainSequence]) -> dict[str, float] | None:
    """bf16 (fp32 masters) and activation recomputation on the megatron backend, against fp32 without it."""
    from rollart.activities.training.megatron.policy import MegatronPolicy
    from rollart.activities.training.updates import accumulate_gradients

    cpu = torch.device("cpu")
    plain = TrainerConfig(backend="megatron", parallel={"tensor": 2}, micro_batch_size=2)
    total = sum(len(s.completion_ids) for s in seqs)
    out = {}
    base = MegatronPolicy(model_dir, plain, cpu)
    accumulate_gradients(base, seqs, total, plain)
    base.sync_grads()
    g_base = base.gathered_hf(grads=True)
    recompute_cfg = plain.model_copy(update={"activation_checkpointing": True})
    recompute = MegatronPolicy(model_dir, recompute_cfg, cpu)
    accumulate_gradients(recompute, seqs, total, recompute_cfg)
    recompute.sync_grads()
    g_re = recompute.gathered_hf(grads=True)
    bf16_cfg = plain.model_copy(update={"dtype": "bfloat16"})
    bf16 = MegatronPolicy(model_dir, bf16_cfg, cpu)
    before = bf16.gathered_hf()
    m = accumulate_gradients(bf16, seqs, total, bf16_cfg)
    outcome = bf16.step(bf16_cfg)
    after = bf16.gathered_hf()
    if g_base is None:
        return None
    out["recompute_grad"] = max(float((g_base[k] - g_re[k]).abs().max()) for k in g_base)
    out["bf16_params"] = float(all(p.dtype == torch.bfloat16 for p in bf16.params))
    out["fp32_masters"] = float(all(m.dtype == torch.float32 for m in bf16.optimizer.masters))
    out["bf16_loss_finite"] = float(outcome.applied and m["loss"] == m["loss"])
    out["bf16_moved"] = max(float((before[k] - after[k]).abs().max()) for k in before)
    return out


@pytest.mark.integration
def test_bf16_keeps_fp32_masters_and_recomputation_changes_no_gradient(tmp_path: Path) -> None:
    model_dir = build_model(tmp_path / "m")
    seqs = [TrainSequence(s.prompt_ids, s.completion_ids, [-5.0] * len(s.completion_ids), s.advantage) for s in batch()]
    d = run_on_ranks(precision_and_recompute, 2, 2, str(model_dir), seqs)[0]
    assert d["recompute_grad"] < 1e-6, d
    assert d["bf16_params"] == d["fp32_masters"] == d["bf16_loss_finite"] == 1.0, d
    assert d["bf16_moved"] > 1e-4, d


def ppo_compare_with_torch(model_dir: str, seqs: list[TrainSequence], cfg_json: str) -> dict[str, float] | None:
    """Megatron's ranks run `ppo_updates` on their shares; the torch backend makes the same updates on the same
    global mini-batches in one process. The leader returns the largest differences."""
    from rollart.activities.training.updates import (
        accumulate_gradients,
        data_shard,
        epoch_seed,
        mini_batch_parts,
        ppo_updates,
        with_proximal_logprobs,
    )

    cfg, ranks, ref, meg = both_backends(model_dir, cfg_json)
    seqs = with_behaviour_logprobs(ref, seqs)
    shares = [data_shard(seqs, r, ranks.data_size) for r in range(ranks.data_size)]
    m_m, outcomes = ppo_updates(meg, ranks, shares, cfg, step=0)
    weights_m = meg.gathered_hf()
    if not ranks.is_leader:
        return None
    proximal = [with_proximal_logprobs(ref, share, cfg.micro_batch_size) for share in shares]
    clip = []
    for epoch in range(cfg.ppo_epochs):
        parts = mini_batch_parts([len(s) for s in shares], cfg.mini_batches, epoch_seed(cfg, 0, epoch))
        for j in range(len(parts[0])):
            chosen = [proximal[r][i] for r in range(len(shares)) for i in parts[r][j]]
            tokens = sum(len(s.completion_ids) for s in chosen)
            clip.append(accumulate_gradients(ref, chosen, tokens, cfg, len(chosen))["clip_frac"])
            ref.step(cfg)
    weights_t = ref.model.state_dict()
    return {
        "updates": float(len(outcomes)),
        "reference_updates": float(len(clip)),
        "clip_frac": m_m["clip_frac"],
        "clip_frac_diff": abs(m_m["clip_frac"] - sum(clip) / len(clip)),
        "weights": max(float((weights_t[k] - w).abs().max()) for k, w in weights_m.items()),
        "moved": max(
            float((weights_t[k] - w).abs().max()) for k, w in hf_state(Path(model_dir)).items() if k in weights_t
        ),
    }


@pytest.mark.integration
def test_ppo_updates_over_data_parallel_ranks_equal_the_same_updates_in_one_process(tmp_path: Path) -> None:
    """2 mini-batches x 2 epochs on D=2: each rank steps 4 times on its part of each mini-batch (one rank's part
    may be smaller), normalised by the whole mini-batch, and the weights match one process making those updates."""
    model_dir = build_model(tmp_path / "m")
    cfg = TrainerConfig(
        backend="megatron", parallel={"data": 2}, eps=1e-6, lr=0.02, micro_batch_size=2, mini_batches=2, ppo_epochs=2
    )
    d = run_on_ranks(ppo_compare_with_torch, 2, 1, str(model_dir), batch(n=7), cfg.model_dump_json())[0]
    print(f"PPO D=2: {json.dumps(d)}")
    assert d["updates"] == d["reference_updates"] == 4.0, d
    assert d["clip_frac"] > 0 and d["clip_frac_diff"] < 1e-5, d
    assert d["weights"] < 1e-4 and d["moved"] > 1e-2, d
