"""Qwen3-MoE on the megatron backend with expert parallelism, against the torch backend (transformers'
Qwen3MoeForCausalLM) on the same weights and batch.

The model is a tiny random Qwen3-MoE (4 experts, top 2, renormalised; router weights scaled so the top-k choice
has margins far above fp32 rounding, norms perturbed) saved with save_pretrained, i.e. with the per-expert names
vLLM loads. Conversion is checked in one process; numerics run the real step code on gloo ranks: one rank
(expert 1) and two data ranks splitting the experts (expert 2): log-probs, gradients, gradient norm, the AdamW
step, the published tensors and a checkpoint round trip.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rollart.activities.training.megatron.convert import hf_to_megatron, megatron_to_hf
from rollart.activities.training.megatron.hf_layout import HfArch, UnsupportedModel
from rollart.spec.config import LossConfig, TrainerConfig
from tests.support.gloo import run_on_ranks
from tests.test_megatron_backend import batch, both_backends, hf_state, with_behaviour_logprobs

VOCAB, EXPERTS, MOE_FFN = 96, 4, 32

MOE = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": MOE_FFN,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_experts": EXPERTS,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "router_aux_loss_coef": 0.0,
    "output_router_logits": False,
    "pad_token_id": 0,
}


def build_moe(out: Path, **overrides: object) -> Path:
    """A random tiny Qwen3-MoE saved as safetensors (per-expert names)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**{**MOE, **overrides}))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("mlp.gate.weight"):  # clear routing margins: the top-k never flips on rounding
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(out)
    return out


def per_expert(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' in-memory fused experts (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I])
    under the per-expert names save_pretrained writes."""
    out = {}
    for k, v in state.items():
        prefix, fused, kind = k.rpartition("mlp.experts.")
        if not fused:
            out[k] = v
            continue
        for e in range(v.shape[0]):
            if kind == "gate_up_proj":
                gate, up = v[e].chunk(2, 0)
                out[f"{prefix}mlp.experts.{e}.gate_proj.weight"] = gate
                out[f"{prefix}mlp.experts.{e}.up_proj.weight"] = up
            else:
                out[f"{prefix}mlp.experts.{e}.down_proj.weight"] = v[e]
    return out


@pytest.mark.parametrize("ep", [1, 2, 4])
def test_hf_to_megatron_to_hf_round_trips_exactly_per_expert_rank(tmp_path: Path, ep: int) -> None:
    model_dir = build_moe(tmp_path / "m")
    arch = HfArch.from_model_dir(model_dir)
    hf = hf_state(model_dir)
    back: dict[str, torch.Tensor] = {}
    for x in range(ep):
        shard = hf_to_megatron(hf.__getitem__, arch, 1, 0, ep, x)
        local = [k for k in shard if k.startswith("decoder.layers.0.mlp.experts.local_experts.")]
        assert len(local) == 2 * EXPERTS // ep  # fc1 and fc2 of this rank's experts only
        back |= megatron_to_hf({k: [v] for k, v in shard.items()}, arch, first_expert=x * EXPERTS // ep)
    assert set(back) == set(hf)
    assert all(torch.equal(back[k], hf[k]) for k in hf)
    fc1 = hf_to_megatron(hf.__getitem__, arch, 1, 0, 2, 1)[
        "decoder.layers.1.mlp.experts.local_experts.0.linear_fc1.weight"
    ]
    assert torch.equal(fc1[:MOE_FFN], hf["model.layers.1.mlp.experts.2.gate_proj.weight"])  # rank 1's first: expert 2


def test_qwen3_moe_is_read_with_its_router_and_experts() -> None:
    arch = HfArch.from_config({**MOE, "model_type": "qwen3_moe", "norm_topk_prob": False})
    assert arch.is_moe and (arch.num_experts, arch.num_experts_per_tok, arch.moe_intermediate_size) == (4, 2, 32)
    assert arch.qk_norm and not arch.norm_topk_prob


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"decoder_sparse_step": 2}, "decoder_sparse_step 2"),
        ({"mlp_only_layers": [0]}, "mlp_only_layers"),
    ],
)
def test_moe_layouts_the_mapping_lacks_are_refused_at_load(overrides: dict, message: str) -> None:
    with pytest.raises(UnsupportedModel, match=message):
        HfArch.from_config({**MOE, "model_type": "qwen3_moe", **overrides})


def test_moe_with_tensor_parallelism_and_uneven_expert_splits_are_refused_saying_why() -> None:
    arch = HfArch.from_config({**MOE, "model_type": "qwen3_moe"})
    with pytest.raises(UnsupportedModel, match=r"needs sequence parallelism.*RMSNorm"):
        arch.check_tensor_parallel(2)
    with pytest.raises(UnsupportedModel, match="expert 3 does not divide the model's 4 experts"):
        arch.check_expert_parallel(3)
    dense = HfArch.from_config({**MOE, "model_type": "qwen3"})
    with pytest.raises(UnsupportedModel, match="dense model_type 'qwen3'"):
        dense.check_expert_parallel(2)
    with pytest.raises(ValueError, match=r"parallel\.expert 2 must divide parallel\.data 3"):
        TrainerConfig(backend="megatron", parallel={"data": 3, "expert": 2})
    with pytest.raises(ValueError, match="needs backend: megatron"):
        TrainerConfig(backend="torch", parallel={"expert": 2, "data": 2})


def test_a_checkpoint_of_another_expert_size_is_refused_saying_what_to_do(tmp_path: Path) -> None:
    from rollart.activities.training.megatron.checkpoint import TensorParallelMismatch, load_sharded

    step = tmp_path / "step-000003"
    step.mkdir()
    (step / "meta.json").write_text(json.dumps({"step": 3, "backend": "megatron", "tensor": 1, "expert": 2}))
    with pytest.raises(TensorParallelMismatch, match=r"2 expert-parallel shards .* trainer\.parallel\.expert: 2"):
        load_sharded(tmp_path, tensor=1, expert=4)


def moe_vs_torch(model_dir: str, cfg_json: str, ckpt: str) -> dict[str, float] | None:
    """On each rank: the torch backend (whole batch) and the megatron backend (its data share, its experts) take
    one step from the same weights; the leader returns the largest differences. Every rank also publishes its
    tensors (`hf_tensors`) and round-trips a checkpoint."""
    from megatron.core import parallel_state as ps

    from rollart.activities.rl.batch import collate
    from rollart.activities.training.updates import accumulate_gradients, data_shard

    cfg, ranks, ref, meg = both_backends(model_dir, cfg_json)
    seqs = with_behaviour_logprobs(ref, batch(n=5, vocab=VOCAB))  # 3 and 2: a filler at D=2
    whole = collate(seqs, ref.pad_id)
    valid = whole.attention_mask.bool()
    valid[:, 0] = False
    with torch.no_grad():
        lp_t, ent_t = ref.logprobs(whole, entropy_grad=False)
        lp_m, ent_m = meg.logprobs(whole, entropy_grad=False)
    total = sum(len(s.completion_ids) for s in seqs)
    m_t = accumulate_gradients(ref, seqs, total, cfg)
    mine = data_shard(seqs, ranks.data_rank, ranks.data_size)
    m_m = ranks.sum_over_data(accumulate_gradients(meg, mine, total, cfg, ranks=ranks))
    meg.sync_grads()
    grads_m = meg.gathered_hf(grads=True)
    grads_t = per_expert({n: p.grad.clone() for n, p in ref.model.named_parameters()})
    norm_t = ref.step(cfg).grad_norm
    norm_m = meg.step(cfg).grad_norm
    weights_m = meg.gathered_hf()
    published = {k: (tuple(v.shape), v.float().clone()) for k, v in meg.hf_tensors()}
    meg.save_checkpoint(Path(ckpt), 0)
    before = {n: p.detach().clone() for n, p in meg.module.named_parameters()}
    with torch.no_grad():
        for p in meg.module.parameters():
            p.add_(1.0)
    step = meg.load_checkpoint(Path(ckpt))
    restored = all(torch.equal(p, before[n]) for n, p in meg.module.named_parameters())
    info = {
        "published": published,
        "restored": float(restored and step == 0),
        "ep": ps.get_expert_model_parallel_world_size(),
    }
    if not ranks.is_leader:
        return info
    weights_t = per_expert(ref.model.state_dict())
    return info | {
        "logprob": float((lp_t - lp_m)[valid].abs().max()),
        "entropy": float((ent_t - ent_m)[valid].abs().max()),
        "loss": abs(m_t["loss"] - m_m["loss"]),
        "grad": max(float((grads_t[k] - g).abs().max()) for k, g in grads_m.items()),
        "grad_max": max(float(g.abs().max()) for g in grads_m.values()),
        "expert_grad_max": max(float(g.abs().max()) for k, g in grads_m.items() if ".experts." in k),
        "weights": max(float((weights_t[k] - w).abs().max()) for k, w in weights_m.items()),
        "grad_norm": abs(norm_t - norm_m) / norm_t,
        "names_match": float(set(grads_m) == set(grads_t) and set(weights_m) == set(weights_t)),
    }


def moe_cases(model_dir: str, cases: list[tuple[str, int, str, str]]) -> dict[str, dict]:
    """On each rank: `moe_vs_torch` for every case (name, expert-parallel size, trainer config, checkpoint root),
    megatron's groups rebuilt for each (a launch of ranks costs more than a case)."""
    from rollart.activities.training.megatron.model import init_model_parallel

    out = {}
    for name, expert, cfg_json, ckpt in cases:
        init_model_parallel(1, seed=0, device=torch.device("cpu"), expert=expert)
        out[name] = moe_vs_torch(model_dir, cfg_json, ckpt)
    return out


CASES = {
    "D2": (1, LossConfig()),
    "D2-E2": (2, LossConfig()),
    "D2-E2-entropy-kl": (2, LossConfig(entropy_coef=0.01, kl_coef=0.1, decoupled=False)),  # the reference model too
}
"""Two data ranks: the experts replicated (expert 1), or split over them (expert 2); (expert size, loss)."""


@pytest.fixture(scope="module")
def moe_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    """Each case's per-rank results, from one launch of 2 gloo ranks."""
    root = tmp_path_factory.mktemp("moe")
    model_dir = build_moe(root / "m")
    cases = []
    for name, (expert, loss) in CASES.items():
        parallel = {"data": 2, "expert": expert}
        cfg = TrainerConfig(backend="megatron", parallel=parallel, eps=1e-6, micro_batch_size=2, loss=loss)
        cases.append((name, expert, cfg.model_dump_json(), str(root / f"ckpt-{name}")))
    per_rank = run_on_ranks(moe_cases, 2, 1, str(model_dir), cases)
    return {name: [r[name] for r in per_rank] for name in CASES} | {"model_dir": str(model_dir)}


@pytest.mark.integration
@pytest.mark.parametrize("case", list(CASES))
def test_megatron_moe_equals_torch_and_publishes_every_expert_once(moe_runs: dict, case: str) -> None:
    """Log-probs within 1e-5, gradients (router and experts included) within 1e-6, one AdamW step (eps 1e-6)
    within 1e-5; the ranks together publish exactly the model dir's tensors, each once; a checkpoint restores."""
    results = moe_runs[case]
    d = results[0]
    print(f"{case}: {json.dumps({k: v for k, v in d.items() if k != 'published'})}")
    assert all(r["ep"] == CASES[case][0] for r in results)
    assert d["names_match"] == 1.0
    assert d["logprob"] < 1e-5 and d["entropy"] < 1e-5 and d["loss"] < 1e-6, d
    assert d["grad"] < 1e-6 and d["expert_grad_max"] > 1e-3 and d["grad_norm"] < 1e-6, d
    assert d["weights"] < 1e-5, d
    assert all(r["restored"] == 1.0 for r in results)
    names = [k for r in results for k in r["published"]]
    on_disk = hf_state(Path(moe_runs["model_dir"]))
    assert sorted(names) == sorted(on_disk)  # every tensor once, across the ranks
    shapes = {k: s for r in results for k, (s, _) in r["published"].items()}
    assert all(shapes[k] == tuple(v.shape) for k, v in on_disk.items())
    if CASES[case][0] > 1:  # each rank publishes its own experts
        assert all(any(".experts." in k for k in r["published"]) for r in results)


@pytest.mark.integration
def test_expert_parallel_publishes_the_weights_replicated_experts_do(moe_runs: dict) -> None:
    """After the same step, the tensors published with the experts split equal those with them replicated."""
    split, whole = ({k: t for r in moe_runs[c] for k, (_, t) in r["published"].items()} for c in ("D2-E2", "D2"))
    assert set(split) == set(whole)
    assert max(float((split[k] - whole[k]).abs().max()) for k in whole) < 1e-5


@pytest.mark.integration
async def test_a_train_step_through_the_rank_agent_at_expert_2_publishes_what_torch_does(
    tiny_model: Path, tmp_path: Path
) -> None:
    """`train_step` as the trainer worker runs it (`TrainerActivities` with a `RankGroup`: real rank processes)
    with `parallel: {data: 2, expert: 2}`, against the torch backend on the same FrozenLake batch: the published
    weights agree within 1e-5 (per-expert names) and the checkpoint has one shard per expert-parallel rank."""
    from temporalio.testing import ActivityEnvironment
    from transformers import AutoTokenizer

    from rollart.activities.trainer import TrainerActivities
    from rollart.client.local import published_tensors
    from rollart.contracts.activities import TrainStepInput
    from rollart.infra.store.payload import LocalStore
    from rollart.spec.config import StoreConfig
    from rollart.workers.trainer_ranks import RankGroup
    from tests.support.batches import frozenlake_batch, load_model

    tok = AutoTokenizer.from_pretrained(tiny_model)
    model_dir = build_moe(tmp_path / "moe", vocab_size=len(tok), max_position_embeddings=512)
    tok.save_pretrained(model_dir)
    store = LocalStore(tmp_path / "store")
    samples = frozenlake_batch(store, load_model(model_dir), tok)

    def step(run: str, **trainer: object) -> TrainStepInput:
        return TrainStepInput(
            job_id=run,
            step=0,
            samples=samples,
            model_dir=str(model_dir),
            run_dir=str(tmp_path / run),
            trainer=TrainerConfig(eps=1e-6, **trainer),
        )

    env = ActivityEnvironment()
    t = await env.run(TrainerActivities(store).train_step, step("torch"))
    group = RankGroup(store=StoreConfig(path=tmp_path / "store"))
    try:
        parallel = {"data": 2, "expert": 2}
        m = await env.run(
            TrainerActivities(store, ranks=group).train_step,
            step("meg", backend="megatron", parallel=parallel, checkpoint_every=1),
        )
    finally:
        group.close()
    want = published_tensors(store, t.weights_key)  # both backends publish the checkpoint's per-expert names
    got = published_tensors(store, m.weights_key)
    assert set(got) == set(want)
    assert max(float((got[k] - want[k]).abs().max()) for k in want) < 1e-5
    assert m.metrics["loss"] == pytest.approx(t.metrics["loss"], abs=1e-6)
    shards = sorted(p.name for p in (tmp_path / "meg" / "checkpoints" / "step-000000").iterdir())
    assert shards == ["meta.json", *(f"{k}-tp00-ep0{x}.pt" for k in ("model", "optim") for x in (0, 1))]
