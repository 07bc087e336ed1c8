"""The architecture of an HF checkpoint, read from its config.json, as megatron's GPTModel needs it.

Supported: the dense Qwen2 / Qwen3 / Llama family — RMSNorm, SwiGLU MLP, rotary position embeddings
(default scaling), q/k/v biases (Qwen2) or none (Llama, Qwen3), Qwen3's qk-norm (an RMSNorm over each
head's dim on q and k, before RoPE), a head dim other than hidden/heads, grouped-query attention, tied
or untied embeddings — and Qwen3-MoE (every layer a mixture of SwiGLU experts behind a softmax top-k
router, at tensor 1: docs/megatron.md, "Mixture of experts"). Anything else fails here, at load, with
what is unsupported and why, rather than training a model that is silently different from the one
vLLM serves.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HfArch", "UnsupportedModel"]

_FAMILIES = {"qwen2": (True, False), "qwen3": (False, True), "llama": (False, False), "qwen3_moe": (False, True)}
"""model_type → (whether q/k/v carry a bias, whether q and k are RMS-normed per head before RoPE)."""

_REFUSED_WHY = {
    "qwen2_moe": "its mixture-of-experts MLP (router, experts and shared expert) is not mapped",
}
"""model_type → why it is refused, where there is more to say than 'not supported'."""


class UnsupportedModel(ValueError):
    """A model (or a layout of it) the megatron backend cannot train; the message says why."""


@dataclass(frozen=True)
class HfArch:
    """Shapes and options of a Qwen2/Qwen3/Llama-family causal LM; `num_experts` > 0 for Qwen3-MoE, whose every
    layer's MLP is `num_experts` SwiGLU experts of width `moe_intermediate_size`, `num_experts_per_tok` of them
    per token, weighted by the router's softmax (renormalised over the chosen ones when `norm_topk_prob`)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    pad_token_id: int
    qk_norm: bool = False
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> HfArch:
        """Read `model_dir/config.json`; raises `UnsupportedModel` for what the megatron backend cannot train."""
        path = Path(model_dir) / "config.json"
        try:
            c = json.loads(path.read_text())
        except FileNotFoundError as e:
            raise UnsupportedModel(
                f"no model at {model_dir} (config.json missing); build one with `rollart init-model --out {model_dir}`"
            ) from e
        return cls.from_config(c, str(path))

    @classmethod
    def from_config(cls, c: dict, source: str = "config.json") -> HfArch:
        """The architecture of an HF config dict (as in config.json)."""
        model_type = c.get("model_type", "?")
        if model_type not in _FAMILIES:
            why = f" ({_REFUSED_WHY[model_type]})" if model_type in _REFUSED_WHY else ""
            raise UnsupportedModel(
                f"{source}: model_type {model_type!r} is not supported by the megatron backend{why} (supported: "
                f"{', '.join(sorted(_FAMILIES))}); use trainer.backend: torch for other architectures"
            )
        qkv_bias, qk_norm = _FAMILIES[model_type]
        problems = []
        if c.get("hidden_act", "silu") != "silu":
            problems.append(f"hidden_act {c['hidden_act']!r} (SwiGLU needs silu)")
        rope = c.get("rope_parameters") or {}
        scaling = c.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        if scaling:
            problems.append(f"rope scaling {scaling!r} (only default RoPE is mapped)")
        if model_type in ("llama", "qwen3") and (c.get("attention_bias") or c.get("mlp_bias")):
            problems.append("attention_bias/mlp_bias (biases on o_proj and the MLP are not mapped)")
        if c.get("use_sliding_window") or any(t != "full_attention" for t in c.get("layer_types") or ()):
            problems.append("sliding-window attention")
        if model_type == "qwen3_moe":
            problems += _moe_problems(c)
        if problems:
            raise UnsupportedModel(f"{source}: the megatron backend cannot train this model: {'; '.join(problems)}")
        heads = int(c["num_attention_heads"])
        hidden = int(c["hidden_size"])
        pad = next((c[k] for k in ("pad_token_id", "eos_token_id") if isinstance(c.get(k), int)), 0)
        return cls(
            model_type=model_type,
            vocab_size=int(c["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(c["intermediate_size"]),
            num_layers=int(c["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(c.get("num_key_value_heads") or heads),
            head_dim=int(c.get("head_dim") or hidden // heads),
            rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
            rope_theta=float(c.get("rope_theta") or rope.get("rope_theta") or 10000.0),
            max_position_embeddings=int(c.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
            pad_token_id=int(pad),
            qk_norm=qk_norm,
            **_moe_fields(c, model_type),
        )

    @property
    def is_moe(self) -> bool:
        """Whether the MLPs are mixtures of experts."""
        return self.num_experts > 0

    def check_tensor_parallel(self, tp: int) -> None:
        """Raise `UnsupportedModel` unless the attention heads split over `tp` ranks (and `tp` is 1 for MoE)."""
        if self.is_moe and tp > 1:
            raise UnsupportedModel(
                f"trainer.parallel.tensor {tp} with a mixture-of-experts model: megatron-core needs sequence "
                "parallelism for MoE with tensor parallelism, and the local layer spec's RMSNorm (no Transformer "
                "Engine) refuses sequence parallelism; use tensor: 1 and split the experts with parallel.expert"
            )
        if self.num_heads % tp:
            raise UnsupportedModel(
                f"trainer.parallel.tensor {tp} does not divide the model's {self.num_heads} attention heads"
            )
        if self.num_kv_heads % tp and tp % self.num_kv_heads:
            raise UnsupportedModel(
                f"trainer.parallel.tensor {tp} and the model's {self.num_kv_heads} key/value heads: one must divide "
                "the other (megatron splits whole kv groups, or replicates one over several ranks)"
            )

    def padded_vocab(self, tp: int) -> int:
        """The vocabulary rounded up to a multiple of `tp` (megatron splits it evenly; the extra rows are masked)."""
        return math.ceil(self.vocab_size / tp) * tp

    def check_expert_parallel(self, ep: int) -> None:
        """Raise `UnsupportedModel` unless the experts split evenly over `ep` ranks (`ep` is 1 for dense models)."""
        if ep == 1:
            return
        if not self.is_moe:
            raise UnsupportedModel(
                f"trainer.parallel.expert {ep} with the dense model_type {self.model_type!r}: expert parallelism "
                "splits mixture-of-experts layers; use expert: 1"
            )
        if self.num_experts % ep:
            raise UnsupportedModel(
                f"trainer.parallel.expert {ep} does not divide the model's {self.num_experts} experts"
            )


def _moe_problems(c: dict) -> list[str]:
    """What of a Qwen3-MoE config the megatron mapping does not cover: dense layers between the sparse ones."""
    problems = []
    if int(c.get("decoder_sparse_step", 1)) != 1:
        problems.append(
            f"decoder_sparse_step {c['decoder_sparse_step']} (only every layer a mixture of experts is mapped)"
        )
    if c.get("mlp_only_layers"):
        problems.append(f"mlp_only_layers {c['mlp_only_layers']} (dense MLP layers among MoE ones are not mapped)")
    if c.get("shared_expert_intermediate_size"):
        problems.append("a shared expert (not mapped)")
    return problems


def _moe_fields(c: dict, model_type: str) -> dict:
    """HfArch's mixture-of-experts fields of a config (none for dense models)."""
    if model_type != "qwen3_moe":
        return {}
    return {
        "num_experts": int(c.get("num_experts") or c["num_local_experts"]),  # the latter: transformers >= 5
        "num_experts_per_tok": int(c["num_experts_per_tok"]),
        "moe_intermediate_size": int(c["moe_intermediate_size"]),
        "norm_topk_prob": bool(c.get("norm_topk_prob", True)),
    }
