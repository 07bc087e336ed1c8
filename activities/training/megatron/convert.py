"""HF (Qwen2/Qwen3/Llama) weights ↔ megatron-core GPTModel shards (local layer spec), per tensor-parallel rank.

Pure tensor functions, no process group: `hf_to_megatron` cuts rank r's shard out of full HF
tensors, `megatron_to_hf` puts full HF tensors back together from every rank's shard. The mapping
(T = tensor-parallel size; verified bit-exact in shared/probes/megatron_cpu_tp.py):

  model.embed_tokens / lm_head       embedding.word_embeddings / output_layer   rows split T ways
                                     (the vocabulary padded with zero rows to a multiple of T)
  q/k/v_proj (+ biases)              linear_qkv: per kv group [its q heads; k; v], rows split T ways
  o_proj, down_proj                  linear_proj, linear_fc2                    columns split T ways
  gate_proj, up_proj                 linear_fc1 = cat(gate_r, up_r) on each rank
  input/post_attention_layernorm,    input_layernorm, pre_mlp_layernorm,        replicated
  model.norm                         decoder.final_layernorm
  self_attn.q_norm, k_norm (Qwen3)   self_attention.q_layernorm, k_layernorm     replicated ([head_dim], shared
                                                                                 by every head)

A tied model has no `lm_head.weight` on either side (megatron shares the embedding; the HF blob
leaves the duplicate out, as the torch backend's does).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F

from rollart.activities.training.megatron.hf_layout import HfArch

__all__ = ["hf_to_megatron", "megatron_to_hf"]

Tensors = Callable[[str], torch.Tensor]
"""Full HF tensors by name (a dict's `__getitem__`, or a lazy safetensors reader)."""


def _rows(t: torch.Tensor, tp: int, r: int) -> torch.Tensor:
    return t.chunk(tp, 0)[r]


def _padded_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    return F.pad(t, (0, 0, 0, rows - t.shape[0])) if t.shape[0] < rows else t


def _qkv(get: Tensors, h: str, arch: HfArch, kind: str) -> torch.Tensor:
    """The fused QKV weight (`kind` 'weight') or bias, laid out per kv group: [q heads of g; k_g; v_g] for each g."""
    ng, hd = arch.num_kv_heads, arch.head_dim
    per_group = arch.num_heads // ng * hd
    tail = (arch.hidden_size,) if kind == "weight" else ()
    q = get(f"{h}self_attn.q_proj.{kind}").reshape(ng, per_group, *tail)
    k = get(f"{h}self_attn.k_proj.{kind}").reshape(ng, hd, *tail)
    v = get(f"{h}self_attn.v_proj.{kind}").reshape(ng, hd, *tail)
    return torch.cat([q, k, v], 1).reshape(-1, *tail)


def hf_to_megatron(get: Tensors, arch: HfArch, tp: int, r: int) -> dict[str, torch.Tensor]:
    """Megatron state dict of tensor-parallel rank `r` of `tp`, from full HF tensors."""
    vocab_rows = arch.padded_vocab(tp)
    out = {"embedding.word_embeddings.weight": _rows(_padded_rows(get("model.embed_tokens.weight"), vocab_rows), tp, r)}
    for i in range(arch.num_layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        gate, up = _rows(get(h + "mlp.gate_proj.weight"), tp, r), _rows(get(h + "mlp.up_proj.weight"), tp, r)
        out |= {
            m + "input_layernorm.weight": get(h + "input_layernorm.weight"),
            m + "self_attention.linear_qkv.weight": _rows(_qkv(get, h, arch, "weight"), tp, r),
            m + "self_attention.linear_proj.weight": get(h + "self_attn.o_proj.weight").chunk(tp, 1)[r],
            m + "pre_mlp_layernorm.weight": get(h + "post_attention_layernorm.weight"),
            m + "mlp.linear_fc1.weight": torch.cat([gate, up], 0),  # each rank: [gate_r; up_r], not a slice of both
            m + "mlp.linear_fc2.weight": get(h + "mlp.down_proj.weight").chunk(tp, 1)[r],
        }
        if arch.qkv_bias:
            out[m + "self_attention.linear_qkv.bias"] = _rows(_qkv(get, h, arch, "bias"), tp, r)
        if arch.qk_norm:
            out[m + "self_attention.q_layernorm.weight"] = get(h + "self_attn.q_norm.weight")
            out[m + "self_attention.k_layernorm.weight"] = get(h + "self_attn.k_norm.weight")
    out["decoder.final_layernorm.weight"] = get("model.norm.weight")
    if not arch.tie_word_embeddings:
        out["output_layer.weight"] = _rows(_padded_rows(get("lm_head.weight"), vocab_rows), tp, r)
    return {k: v.clone().contiguous() for k, v in out.items()}


def megatron_to_hf(shards: Mapping[str, Sequence[torch.Tensor]], arch: HfArch) -> dict[str, torch.Tensor]:
    """Full HF tensors from every tensor-parallel rank's shard (`shards[name][r]`); vocabulary padding removed."""
    ng, hd, hidden = arch.num_kv_heads, arch.head_dim, arch.hidden_size
    per_group = arch.num_heads // ng * hd

    def rows(name: str) -> torch.Tensor:
        return torch.cat(list(shards[name]), 0)

    def cols(name: str) -> torch.Tensor:
        return torch.cat(list(shards[name]), 1)

    out = {"model.embed_tokens.weight": rows("embedding.word_embeddings.weight")[: arch.vocab_size]}
    for i in range(arch.num_layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        q, k, v = (
            rows(m + "self_attention.linear_qkv.weight")
            .view(ng, per_group + 2 * hd, hidden)
            .split([per_group, hd, hd], 1)
        )
        gate_up = [s.chunk(2, 0) for s in shards[m + "mlp.linear_fc1.weight"]]
        out |= {
            h + "input_layernorm.weight": shards[m + "input_layernorm.weight"][0],
            h + "self_attn.q_proj.weight": q.reshape(-1, hidden),
            h + "self_attn.k_proj.weight": k.reshape(-1, hidden),
            h + "self_attn.v_proj.weight": v.reshape(-1, hidden),
            h + "self_attn.o_proj.weight": cols(m + "self_attention.linear_proj.weight"),
            h + "post_attention_layernorm.weight": shards[m + "pre_mlp_layernorm.weight"][0],
            h + "mlp.gate_proj.weight": torch.cat([g for g, _ in gate_up], 0),
            h + "mlp.up_proj.weight": torch.cat([u for _, u in gate_up], 0),
            h + "mlp.down_proj.weight": cols(m + "mlp.linear_fc2.weight"),
        }
        if arch.qkv_bias:
            qb, kb, vb = (
                rows(m + "self_attention.linear_qkv.bias").view(ng, per_group + 2 * hd).split([per_group, hd, hd], 1)
            )
            out |= {
                h + "self_attn.q_proj.bias": qb.reshape(-1),
                h + "self_attn.k_proj.bias": kb.reshape(-1),
                h + "self_attn.v_proj.bias": vb.reshape(-1),
            }
        if arch.qk_norm:
            out[h + "self_attn.q_norm.weight"] = shards[m + "self_attention.q_layernorm.weight"][0]
            out[h + "self_attn.k_norm.weight"] = shards[m + "self_attention.k_layernorm.weight"][0]
    out["model.norm.weight"] = shards["decoder.final_layernorm.weight"][0]
    if not arch.tie_word_embeddings:
        out["lm_head.weight"] = rows("output_layer.weight")[: arch.vocab_size]
    return {k: v.contiguous() for k, v in out.items()}
