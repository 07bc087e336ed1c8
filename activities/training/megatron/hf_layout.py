"""The architecture of an HF checkpoint, read from its config.json, as megatron's GPTModel needs it.

Supported: the dense Qwen2 / Qwen3 / Llama family — RMSNorm, SwiGLU MLP, rotary position embeddings
(default scaling), q/k/v biases (Qwen2) or none (Llama, Qwen3), Qwen3's qk-norm (an RMSNorm over each
head's dim on q and k, before RoPE), a head dim other than hidden/heads, grouped-query attention, tied
or untied embeddings. Anything else (Qwen3-MoE included: docs/megatron.md says what it needs) fails
here, at load, with what is unsupported and why, rather than training a model that is silently
different from the one vLLM serves.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HfArch", "UnsupportedModel"]

_FAMILIES = {"qwen2": (True, False), "qwen3": (False, True), "llama": (False, False)}
"""model_type → (whether q/k/v carry a bias, whether q and k are RMS-normed per head before RoPE)."""

_REFUSED_WHY = {
    "qwen3_moe": "its mixture-of-experts MLP is not mapped to megatron's MoE layers, which need sequence "
    "parallelism at tensor > 1 (docs/megatron.md: architectures per backend)",
    "qwen2_moe": "its mixture-of-experts MLP (router, experts and shared expert) is not mapped",
}
"""model_type → why it is refused, where there is more to say than 'not supported'."""


class UnsupportedModel(ValueError):
    """A model (or a layout of it) the megatron backend cannot train; the message says why."""


@dataclass(frozen=True)
class HfArch:
    """Shapes and options of a dense Qwen2/Qwen3/Llama-family causal LM."""

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
        )

    def check_tensor_parallel(self, tp: int) -> None:
        """Raise `UnsupportedModel` unless the attention heads split over `tp` ranks."""
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
