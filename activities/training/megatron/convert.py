"""HF (Qwen2/Qwen3/Llama) weights ↔ megatron-core GPTModel shards (local layer spec), per tensor-parallel rank.

Pure tensor functions, no process group: `hf_to_megatron` cuts rank r's shard out of full HF
tensors, `hf_of` puts the HF tensors of one megatron tensor back together from every rank's shard
(`megatron_to_hf`: of all of them). The mapping
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

Qwen3-MoE (tensor 1; X = expert-parallel size, E experts, n = E / X local to each expert-parallel rank x):

  mlp.gate (the router)              mlp.router                                 replicated
  mlp.experts.{x·n+j}.gate/up_proj   mlp.experts.local_experts.{j}.linear_fc1   = cat(gate, up), on rank x
  mlp.experts.{x·n+j}.down_proj      mlp.experts.local_experts.{j}.linear_fc2   on rank x

(the per-expert names transformers' save_pretrained writes and vLLM loads; verified against
Qwen3MoeForCausalLM in tests/test_megatron_moe.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F

from rollart.activities.training.megatron.hf_layout import HfArch

__all__ = ["hf_of", "hf_to_megatron", "megatron_to_hf"]

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


def _experts_to_megatron(get: Tensors, arch: HfArch, h: str, m: str, ep: int, x: int) -> dict[str, torch.Tensor]:
    """One MoE layer's router and expert-parallel rank `x`'s experts (of `ep`), from full HF tensors."""
    n = arch.num_experts // ep
    out = {m + "mlp.router.weight": get(h + "mlp.gate.weight")}
    for j in range(n):
        e, local = f"{h}mlp.experts.{x * n + j}.", f"{m}mlp.experts.local_experts.{j}."
        out[local + "linear_fc1.weight"] = torch.cat([get(e + "gate_proj.weight"), get(e + "up_proj.weight")], 0)
        out[local + "linear_fc2.weight"] = get(e + "down_proj.weight")
    return out


def hf_to_megatron(get: Tensors, arch: HfArch, tp: int, r: int, ep: int = 1, x: int = 0) -> dict[str, torch.Tensor]:
    """Megatron state dict of tensor-parallel rank `r` of `tp` (and, for MoE, expert-parallel rank `x` of `ep`),
    from full HF tensors."""
    vocab_rows = arch.padded_vocab(tp)
    out = {"embedding.word_embeddings.weight": _rows(_padded_rows(get("model.embed_tokens.weight"), vocab_rows), tp, r)}
    for i in range(arch.num_layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        out |= {
            m + "input_layernorm.weight": get(h + "input_layernorm.weight"),
            m + "self_attention.linear_qkv.weight": _rows(_qkv(get, h, arch, "weight"), tp, r),
            m + "self_attention.linear_proj.weight": get(h + "self_attn.o_proj.weight").chunk(tp, 1)[r],
            m + "pre_mlp_layernorm.weight": get(h + "post_attention_layernorm.weight"),
        }
        if arch.is_moe:
            out |= _experts_to_megatron(get, arch, h, m, ep, x)
        else:
            gate, up = _rows(get(h + "mlp.gate_proj.weight"), tp, r), _rows(get(h + "mlp.up_proj.weight"), tp, r)
            out[m + "mlp.linear_fc1.weight"] = torch.cat([gate, up], 0)  # each rank: [gate_r; up_r], not a slice
            out[m + "mlp.linear_fc2.weight"] = get(h + "mlp.down_proj.weight").chunk(tp, 1)[r]
        if arch.qkv_bias:
            out[m + "self_attention.linear_qkv.bias"] = _rows(_qkv(get, h, arch, "bias"), tp, r)
        if arch.qk_norm:
            out[m + "self_attention.q_layernorm.weight"] = get(h + "self_attn.q_norm.weight")
            out[m + "self_attention.k_layernorm.weight"] = get(h + "self_attn.k_norm.weight")
    out["decoder.final_layernorm.weight"] = get("model.norm.weight")
    if not arch.tie_word_embeddings:
        out["output_layer.weight"] = _rows(_padded_rows(get("lm_head.weight"), vocab_rows), tp, r)
    return {k: v.clone().contiguous() for k, v in out.items()}


def hf_of(name: str, shards: Sequence[torch.Tensor], arch: HfArch, first_expert: int = 0) -> dict[str, torch.Tensor]:
    """The full HF tensors one megatron tensor holds, from every tensor-parallel rank's shard of it (`shards[r]`);
    a local expert j is HF's expert `first_expert + j` (the first expert of the rank that holds it).

    One megatron tensor at a time, so a publisher never needs more than one of them gathered.
    """
    ng, hd, hidden = arch.num_kv_heads, arch.head_dim, arch.hidden_size
    per_group = arch.num_heads // ng * hd
    rows = torch.cat(list(shards), 0) if len(shards) > 1 else shards[0]
    if name == "embedding.word_embeddings.weight":
        return {"model.embed_tokens.weight": rows[: arch.vocab_size]}
    if name == "output_layer.weight":
        return {"lm_head.weight": rows[: arch.vocab_size]}
    if name == "decoder.final_layernorm.weight":
        return {"model.norm.weight": shards[0]}
    prefix, _, rest = name.partition("decoder.layers.")
    i, _, part = rest.partition(".")
    if prefix or not i.isdigit():
        raise KeyError(f"no HF tensor is known for megatron tensor {name!r}")
    h = f"model.layers.{i}."
    if part in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        kind = part.rsplit(".", 1)[1]
        tail = (hidden,) if kind == "weight" else ()
        q, k, v = rows.view(ng, per_group + 2 * hd, *tail).split([per_group, hd, hd], 1)
        return {h + f"self_attn.{p}_proj.{kind}": t.reshape(-1, *tail) for p, t in zip("qkv", (q, k, v))}
    if part == "mlp.router.weight":
        return {h + "mlp.gate.weight": shards[0]}
    if part.startswith("mlp.experts.local_experts."):
        return _expert_hf(h, part.removeprefix("mlp.experts.local_experts."), shards, first_expert)
    if part == "mlp.linear_fc1.weight":
        gate_up = [s.chunk(2, 0) for s in shards]
        return {
            h + "mlp.gate_proj.weight": torch.cat([g for g, _ in gate_up], 0),
            h + "mlp.up_proj.weight": torch.cat([u for _, u in gate_up], 0),
        }
    by_columns = {
        "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
        "mlp.linear_fc2.weight": "mlp.down_proj.weight",
    }
    if part in by_columns:
        return {h + by_columns[part]: torch.cat(list(shards), 1) if len(shards) > 1 else shards[0]}
    replicated = {
        "input_layernorm.weight": "input_layernorm.weight",
        "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
        "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
        "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    }
    if part in replicated:
        return {h + replicated[part]: shards[0]}
    raise KeyError(f"no HF tensor is known for megatron tensor {name!r}")


def _expert_hf(h: str, local: str, shards: Sequence[torch.Tensor], first_expert: int) -> dict[str, torch.Tensor]:
    """HF tensors of local expert `local` ('{j}.linear_fc1.weight' or '{j}.linear_fc2.weight'); tensor 1 only."""
    if len(shards) != 1:
        raise ValueError("experts are mapped at tensor-parallel size 1 only (see HfArch.check_tensor_parallel)")
    j, _, kind = local.partition(".")
    e = f"{h}mlp.experts.{first_expert + int(j)}."
    if kind == "linear_fc1.weight":
        gate, up = shards[0].chunk(2, 0)
        return {e + "gate_proj.weight": gate, e + "up_proj.weight": up}
    if kind == "linear_fc2.weight":
        return {e + "down_proj.weight": shards[0]}
    raise KeyError(f"no HF tensor is known for megatron expert tensor {local!r} of {h}")


def megatron_to_hf(
    shards: Mapping[str, Sequence[torch.Tensor]], arch: HfArch, first_expert: int = 0
) -> dict[str, torch.Tensor]:
    """Full HF tensors from every tensor-parallel rank's shard (`shards[name][r]`); vocabulary padding removed.
    For MoE, `shards` holds one expert-parallel rank's experts, the first of which is HF's `first_expert`."""
    out: dict[str, torch.Tensor] = {}
    for name, parts in shards.items():
        out |= hf_of(name, parts, arch, first_expert)
    return {k: v.contiguous() for k, v in out.items()}
