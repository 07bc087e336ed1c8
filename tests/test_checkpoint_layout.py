"""A Qwen3-MoE trained by the torch backend is published, served and resumed under its checkpoint's names.

transformers 5 fuses each layer's experts in memory (`mlp.experts.gate_up_proj`); the model dir, vLLM and the
engines' weight check know one tensor per expert. The trainer publishes that layout and takes it back, and the
HF engine loads it (activities/rl/checkpoint_layout.py). The oracle for the names is the model's own
safetensors file, for the values an independent split of the fused tensors (`per_expert`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rollart.activities.engines.base import check_weights
from rollart.activities.engines.factory import create_engine
from rollart.activities.training.torch_policy import TorchPolicy
from rollart.spec.config import EngineConfig, TrainerConfig
from tests.test_engines import PROMPT, SAMPLING, max_error, publish, teacher_forced
from tests.test_megatron_moe import build_moe, per_expert


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    """A tiny Qwen3-MoE (4 experts, top 2) with the tiny model's tokenizer: what a MoE job's model dir holds."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    out = build_moe(
        tmp_path_factory.mktemp("moe") / "model", vocab_size=len(tok), head_dim=32, max_position_embeddings=256
    )
    tok.save_pretrained(out)
    return out


def test_the_torch_backend_publishes_and_loads_a_moe_as_its_checkpoint_holds_it(moe_dir: Path) -> None:
    policy = TorchPolicy(moe_dir, TrainerConfig(), torch.device("cpu"))
    disk = load_file(str(moe_dir / "model.safetensors"))
    published = dict(policy.hf_tensors())
    assert set(published) == set(disk) and any(".experts.3.up_proj." in k for k in published)
    assert all(torch.equal(published[k], t) for k, t in disk.items())
    assert all(torch.equal(published[k], t) for k, t in per_expert(policy.model.state_dict()).items())

    policy.load_hf_tensors({k: t + 1.0 for k, t in disk.items()})  # a resume from a published version
    assert all(torch.equal(t, disk[k] + 1.0) for k, t in policy.hf_tensors())
    fused = policy.model.state_dict()["model.layers.0.mlp.experts.gate_up_proj"]
    assert torch.equal(fused[2, : fused.shape[1] // 2], disk["model.layers.0.mlp.experts.2.gate_proj.weight"] + 1.0)

    lacking = {k: t for k, t in disk.items() if k != "model.layers.1.mlp.experts.1.down_proj.weight"}
    with pytest.raises(ValueError, match=r"missing \['model\.layers\.1\.mlp\.experts\.1\.down_proj\.weight'\]"):
        policy.load_hf_tensors(lacking)


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["hf", "vllm"])
async def test_an_engine_serves_a_published_moe_and_its_own_weights_again(moe_dir: Path, kind: str) -> None:
    """A MoE with perturbed experts, published as the trainer does, passes the engines' weight check; the engine's
    log-probs are then the new model's, and after a reload from the model dir the original's again. On vLLM's
    CPU backend this needs the experts packed again after a reload (activities/engines/vllm_extension.py)."""
    from transformers import AutoModelForCausalLM

    original = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32).eval()
    model = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".experts." in name:
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
    source = publish(model, 1, moe_dir, job=f"moe-{kind}")
    check_weights(source.manifest, moe_dir)
    engine = create_engine(moe_dir, EngineConfig(kind=kind, max_model_len=128, kv_cache_gib=1))
    await engine.start()
    try:
        await engine.load_weights(source, 1)
        out = await engine.generate(PROMPT, SAMPLING, "after")
        assert max_error(out, teacher_forced(model, out)) < 1e-4
        assert max_error(out, teacher_forced(original, out)) > 0.05
        await engine.load_weights(None, 2)
        out = await engine.generate(PROMPT, SAMPLING, "again")
        assert max_error(out, teacher_forced(original, out)) < 1e-4
    finally:
        await engine.shutdown()
