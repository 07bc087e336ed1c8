"""The torch backend with FSDP2 against the same backend in one process: log-probs, gradients, one AdamW step.

On 2 and 4 gloo ranks each rank builds the single-process TorchPolicy (the whole batch) and its FsdpPolicy
shard from the same HF weights, runs the real step code on its data-parallel share (forward passes kept in
lockstep: the shares differ in micro-batch count, one rank of four holds none; the 4-rank run packs its
micro-batches, `trainer.packing`, with layers kept gathered after the forward; a third trains LoRA adapters),
takes one AdamW step, halves it as the trust region does, and compares; then loads what it published back into
the shards (a resume from published weights). The model is a small tied Qwen2 (the tied head shares the
embedding's shard) with an odd vocabulary, or, on 2 plain ranks, a tiny Qwen3-MoE (tests/test_megatron_moe.py).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from rollart.activities.rl.batch import TrainSequence, collate
from rollart.spec.config import FsdpConfig, LoraConfig, LossConfig, PackingConfig, TrainerConfig
from tests.support.gloo import run_on_plain_ranks
from tests.test_megatron_backend import build_model as build_dense

pytestmark = pytest.mark.integration  # spawned gloo rank processes

TINY = {
    "vocab_size": 387,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 64,
    "tie_word_embeddings": True,
    "pad_token_id": 0,
}


def build_model(out: Path) -> Path:
    """A random tiny tied Qwen2 saved as safetensors, biases and norms perturbed away from 0 and 1."""
    return build_dense(out, **TINY)


def batch(n: int, seed: int = 0) -> list[TrainSequence]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        completion = [rng.randrange(387) for _ in range(rng.randint(1, 5))]
        behav = [-rng.uniform(3.0, 8.0) for _ in completion]
        prompt = [rng.randrange(387) for _ in range(rng.randint(3, 9))]
        out.append(TrainSequence(prompt, completion, behav, rng.choice([-1.0, 0.5, 1.2])))
    return out


def published(policy: Any) -> dict[str, torch.Tensor]:
    """What the policy publishes: its LoRA adapter's tensors, or its HF tensors (on the leader; {} elsewhere)."""
    from safetensors.torch import load as st_load

    if policy.lora:
        files = policy.adapter_files()
        return st_load(files["adapter_model.safetensors"]) if files else {}
    return {k: v.clone() for k, v in policy.hf_tensors()}


def load_published(policy: Any, tensors: dict[str, torch.Tensor]) -> None:
    """Load what `published` gave into `policy`, as a resume from the store does."""
    from safetensors.torch import save as st_save

    if policy.lora:
        policy.load_adapter_blob(st_save(tensors))
    else:
        policy.load_hf_tensors(tensors)


def fsdp_against_torch(model_dir: str, cfg_json: str, n: int) -> dict[str, float] | None:
    """On each rank: one step of the single-process policy on the whole batch and of the FSDP shard on the
    rank's share; the leader returns the largest differences."""
    from rollart.activities.training.fsdp_policy import FsdpPolicy
    from rollart.activities.training.ranks import FsdpRanks
    from rollart.activities.training.torch_policy import TorchPolicy
    from rollart.activities.training.updates import accumulate_gradients, data_shard

    cpu = torch.device("cpu")
    cfg = TrainerConfig.model_validate_json(cfg_json)
    ranks = FsdpRanks(cpu)
    torch.manual_seed(0)  # LoRA's A matrices start random: alike in both
    one = TorchPolicy(model_dir, cfg.model_copy(update={"fsdp": None}), cpu)
    torch.manual_seed(0)
    sharded = FsdpPolicy(model_dir, cfg, cpu)
    seqs = batch(n)
    whole = collate(seqs, one.pad_id)
    valid = whole.attention_mask.bool()
    valid[:, 0] = False
    with torch.no_grad():
        lp_1, ent_1 = one.logprobs(whole, entropy_grad=False)
        lp_s, ent_s = sharded.logprobs(whole, entropy_grad=False)
    total = sum(s.loss_tokens for s in seqs)
    m_1 = accumulate_gradients(one, seqs, total, cfg)
    mine = data_shard(seqs, ranks.data_rank, ranks.data_size)
    m_s = ranks.sum_over_data(accumulate_gradients(sharded, mine, total, cfg, ranks=ranks))
    grads_1 = {n: p.grad for n, p in one.model.named_parameters() if p.grad is not None}
    grads_s = {n: p.grad.full_tensor() for n, p in sharded.model.named_parameters() if p.grad is not None}
    before = published(one)
    one.remember_weights(), sharded.remember_weights()
    norm_1, norm_s = one.step(cfg).grad_norm, sharded.step(cfg).grad_norm
    with torch.no_grad():  # the trust region's measure: without resharding, layers may stay gathered
        one.logprobs(whole, entropy_grad=False), sharded.logprobs(whole, entropy_grad=False)
    one.shrink_update(0.5), sharded.shrink_update(0.5)  # ... and the next forward would see stale weights
    with torch.no_grad():
        shrunk_1, shrunk_s = one.logprobs(whole, entropy_grad=False)[0], sharded.logprobs(whole, entropy_grad=False)[0]
    weights_1, weights_s = published(one), published(sharded)
    load_published(sharded, {k: v + 1.0 for k, v in weights_1.items()})
    loaded = published(sharded)
    if not ranks.is_leader:
        return None
    return {
        "logprob": float((lp_1 - lp_s)[valid].abs().max()),
        "entropy": float((ent_1 - ent_s)[valid].abs().max()),
        "loss": abs(m_1["loss"] - m_s["loss"]),
        "kl": abs(m_1["kl"] - m_s["kl"]),
        "grad": max(float((grads_1[k] - g).abs().max()) for k, g in grads_s.items()),
        "grad_max": max(float(g.abs().max()) for g in grads_s.values()),
        "grad_norm": abs(norm_1 - norm_s) / norm_1,
        "shrunk_logprob": float((shrunk_1 - shrunk_s)[valid].abs().max()),
        "weights": max(float((weights_1[k] - w).abs().max()) for k, w in weights_s.items()),
        "loaded": max(float((weights_1[k] + 1.0 - w).abs().max()) for k, w in loaded.items()),
        "moved": max(float((weights_1[k] - w).abs().max()) for k, w in before.items()),
        "names_match": float(set(weights_s) == set(weights_1) and set(grads_s) == set(grads_1)),
        "per_expert": float(any(".experts.0." in k for k in weights_s)),
    }


@pytest.mark.parametrize(
    ("world", "sequences", "extra"),
    [
        # a Qwen3-MoE: experts fused in memory, one tensor per expert published and loaded (checkpoint_layout.py)
        (2, 5, {"moe": True}),
        # packed: the filler of the rank without data too; layers kept gathered from forward to backward
        (4, 3, {"packing": PackingConfig(max_tokens=16), "reshard_after_forward": False}),
        (2, 5, {"lora": LoraConfig(rank=4)}),  # peft wraps, then FSDP shards: only the adapters train
    ],
    ids=["2 ranks Qwen3-MoE", "4 ranks packed", "2 ranks LoRA"],
)
def test_fsdp_ranks_match_one_process(tmp_path: Path, world: int, sequences: int, extra: dict[str, Any]) -> None:
    from tests.test_megatron_moe import build_moe

    moe = extra.get("moe", False)
    model_dir = str(build_moe(tmp_path / "m", vocab_size=387) if moe else build_model(tmp_path / "m"))
    reshard = extra.get("reshard_after_forward", True)
    cfg = TrainerConfig(
        fsdp=FsdpConfig(ranks=world, reshard_after_forward=reshard),
        **{k: v for k, v in extra.items() if k not in ("reshard_after_forward", "moe")},
        micro_batch_size=2,
        lr=1e-2,
        grad_clip=0.5,  # the clip engages: the global norm over shards must be right
        loss=LossConfig(entropy_coef=0.01, kl_coef=0.1, decoupled=False),
    )
    (diff, *rest) = run_on_plain_ranks(fsdp_against_torch, world, model_dir, cfg.model_dump_json(), sequences)
    assert rest == [None] * (world - 1)
    assert diff["names_match"] == 1.0
    assert diff["per_expert"] == float(moe)  # published as the checkpoint on disk holds them
    assert diff["grad_max"] > 1e-3 and diff["moved"] > 1e-3  # the comparisons are not of zeros
    for key in ("logprob", "entropy", "loss", "kl", "grad", "grad_norm", "shrunk_logprob", "weights", "loaded"):
        assert diff[key] < 1e-6, (key, diff)
