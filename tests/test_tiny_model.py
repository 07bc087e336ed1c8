"""The offline tiny model: deterministic, atomic, and a tokenizer that suits our tasks."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from rollart.infra.tiny_model import EOS_TOKEN, build_tiny_model, ensure_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def test_files_written(model_dir: Path) -> None:
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (model_dir / name).is_file(), name
    leftovers = [p.name for p in model_dir.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_deterministic(model_dir: Path, tmp_path: Path) -> None:
    again = build_tiny_model(tmp_path / "again", seed=0)
    assert (again / "model.safetensors").read_bytes() == (model_dir / "model.safetensors").read_bytes()
    assert (again / "tokenizer.json").read_bytes() == (model_dir / "tokenizer.json").read_bytes()
    other = build_tiny_model(tmp_path / "other", seed=1)
    assert (other / "model.safetensors").read_bytes() != (model_dir / "model.safetensors").read_bytes()


def test_rebuild_replaces_existing(tmp_path: Path) -> None:
    out = build_tiny_model(tmp_path / "m", seed=0)
    (out / "stale.txt").write_text("x")
    build_tiny_model(out, seed=0)
    assert not (out / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


@pytest.mark.parametrize("text", ["SFFF\nFHAH\nmove: L", "é✓\x00", "3+4=7\n", "anything 😀 \t\r\n 123456", ""])
def test_tokenizer_round_trips(tokenizer, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text


def test_raw_tokenizer_matches_loaded_one(model_dir: Path, tokenizer) -> None:
    """transformers loads a qwen2 tokenizer as Qwen2Tokenizer (its own pipeline): it must agree with the file."""
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    for text in ["SFFF\nFHAH\nmove: L", "answer: 12", "é✓\x00 99 100"]:
        assert raw.encode(text).ids == tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("piece", ["SFFF", "FHFH", "FFFH", "HFFG", "AFFF", "FHAH", "HFAG", " L", *map(str, range(19))])
def test_single_tokens(tokenizer, piece: str) -> None:
    assert len(tokenizer.encode(piece, add_special_tokens=False)) == 1


def test_vocab_and_eos(tokenizer) -> None:
    assert 300 <= len(tokenizer) <= 400
    assert tokenizer.eos_token == EOS_TOKEN
    assert tokenizer.encode(EOS_TOKEN, add_special_tokens=False) == [tokenizer.eos_token_id]


def test_loads_with_transformers(model_dir: Path, tokenizer) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    cfg = model.config
    assert model.dtype == torch.float32
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.head_dim) == (128, 2, 2, 64)
    assert cfg.tie_word_embeddings and cfg.max_position_embeddings >= 1024
    assert cfg.vocab_size == len(tokenizer)
    ids = torch.tensor([tokenizer.encode("SFFF\nmove:", add_special_tokens=False)])
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], cfg.vocab_size)


def test_ensure_is_idempotent_and_safe_concurrently(tmp_path: Path) -> None:
    out = tmp_path / "m"
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(ensure_tiny_model(out))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [out.absolute(), out.absolute()]
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model(out) == out.absolute()
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == ["m"]


def test_the_lora_variant_differs_only_in_its_output_scale(model_dir: Path, tmp_path: Path) -> None:
    """`tiny-lora`: the final norm's weight 4 (what lets LoRA learn a confident policy), every other tensor equal."""
    from safetensors.torch import load_file

    from rollart.infra.tiny_model import first_use_scale

    scaled = build_tiny_model(tmp_path / "lora", seed=0, output_scale=4.0)
    a, b = load_file(model_dir / "model.safetensors"), load_file(scaled / "model.safetensors")
    assert [k for k in a if not a[k].equal(b[k])] == ["model.norm.weight"] and b["model.norm.weight"].eq(4.0).all()
    assert first_use_scale(Path(".rollart/models/tiny")) == 1.0
    assert first_use_scale(Path(".rollart/models/tiny-lora")) == 4.0
    assert first_use_scale(Path(".rollart/models/tiny-lroa")) is None  # a typo is not built on first use
    assert first_use_scale(tmp_path / "tiny") is None


def test_the_moe_variant_is_a_qwen3_moe_with_the_same_tokenizer(model_dir: Path, tmp_path: Path) -> None:
    """`tiny-moe` (`rollart init-model --moe`): the tiny model's size and tokenizer, each MLP a router over 4
    experts, top 2, saved with one tensor per expert as a checkpoint holds them (what vLLM loads)."""
    import json

    from safetensors.torch import load_file

    from rollart.infra.tiny_model import first_use_options

    moe = build_tiny_model(tmp_path / "moe", seed=0, moe=True)
    config = json.loads((moe / "config.json").read_text())
    assert config["architectures"] == ["Qwen3MoeForCausalLM"] and config["num_experts_per_tok"] == 2
    assert (moe / "tokenizer.json").read_text() == (model_dir / "tokenizer.json").read_text()
    names = load_file(moe / "model.safetensors").keys()
    assert {f"model.layers.1.mlp.experts.{e}.up_proj.weight" for e in range(4)} <= names
    assert "model.layers.0.mlp.gate.weight" in names
    assert first_use_options(Path(".rollart/models/tiny-moe")) == {"output_scale": 1.0, "chat": False, "moe": True}
    assert first_use_options(Path(".rollart/models/tiny"))["moe"] is False
