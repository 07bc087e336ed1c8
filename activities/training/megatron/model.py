"""megatron-core's GPTModel for an HF Qwen2/Qwen3/Llama architecture, and the process groups it runs in.

The local layer spec (plain torch RMSNorm, megatron's own attention) runs on CPUs and GPUs alike,
with no Transformer Engine or apex. Fusions are off, dropout is 0, and attention gets an explicit
causal mask. The vocabulary is padded to a multiple of the tensor-parallel size (see `convert`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from rollart.activities.training.megatron.hf_layout import HfArch
from rollart.spec.config import TrainerConfig

__all__ = ["build_gpt", "causal_mask", "init_model_parallel", "wrap_ddp"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def init_model_parallel(tensor: int, seed: int, device: torch.device) -> None:
    """Megatron's tensor/data-parallel groups over the initialised default group, and its RNG streams."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    if device.type == "cpu":
        from rollart.activities.training.megatron.cpu_shims import apply_cpu_shims

        apply_cpu_shims()
    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    ps.initialize_model_parallel(tensor_model_parallel_size=tensor)
    model_parallel_cuda_manual_seed(seed)


def build_gpt(arch: HfArch, cfg: TrainerConfig, device: torch.device) -> Any:
    """An uninitialised GPTModel (weights are loaded from HF right after) sharded over the tensor group."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.enums import AttnBackend
    from megatron.core.transformer.transformer_config import TransformerConfig

    tp = ps.get_tensor_model_parallel_world_size()
    dtype = _DTYPES[cfg.dtype]
    recompute: dict[str, Any] = {}
    if cfg.activation_checkpointing:
        recompute = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    config = TransformerConfig(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        ffn_hidden_size=arch.intermediate_size,
        num_attention_heads=arch.num_heads,
        num_query_groups=arch.num_kv_heads,
        kv_channels=arch.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=arch.rms_norm_eps,
        gated_linear_unit=True,  # SwiGLU: fc1 = [gate; up], silu(gate) * up
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=arch.qkv_bias,
        qk_layernorm=arch.qk_norm,  # also what makes finalize_model_grads sum their gradients over the TP group
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        sequence_parallel=False,
        params_dtype=dtype,
        bf16=dtype is torch.bfloat16,
        use_cpu_initialization=device.type == "cpu",
        # perform_initialization stays on although the HF weights overwrite it: it is also what marks weights as
        # tensor-parallel (`tensor_model_parallel`), which the global gradient norm relies on
        calculate_per_token_loss=True,  # the loss is already a share of the batch's token mean: sum over DP
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        cross_entropy_loss_fusion=False,
        persist_layer_norm=False,
        attention_softmax_in_fp32=True,
        attention_backend=AttnBackend.local,
        **recompute,
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=arch.qk_norm),
        vocab_size=arch.padded_vocab(tp),
        max_sequence_length=arch.max_position_embeddings,
        pre_process=True,
        post_process=True,
        share_embeddings_and_output_weights=arch.tie_word_embeddings,
        position_embedding_type="rope",
        rotary_base=int(arch.rope_theta),
        rotary_percent=1.0,
        parallel_output=True,  # logits stay split over the vocabulary
    )
    return model.to(device=device, dtype=dtype)  # torch's RMSNorm ignores params_dtype


def wrap_ddp(model: Any) -> Any:
    """Megatron's DDP: fp32 gradient buffers (`main_grad`), summed over data-parallel ranks at `finish_grad_sync`."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=False
    )
    return DistributedDataParallel(config=model.config, ddp_config=ddp_config, module=model)


def causal_mask(seq_len: int, device: torch.device) -> torch.Tensor:
    """Megatron's boolean attention mask (True = masked): the causal one. Right padding needs nothing more."""
    return torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool, device=device), 1)[None, None]
