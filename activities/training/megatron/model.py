"""megatron-core's GPTModel for an HF Qwen2/Qwen3/Llama/Qwen3-MoE architecture, and the process groups it runs in.

The local layer spec (plain torch RMSNorm, megatron's own attention) runs on CPUs and GPUs alike,
with no Transformer Engine or apex. Fusions are off, dropout is 0, and attention gets an explicit
causal mask. The vocabulary is padded to a multiple of the tensor-parallel size (see `convert`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

from rollart.activities.rl.packing import Packed
from rollart.activities.training.megatron.hf_layout import HfArch
from rollart.spec.config import TrainerConfig

__all__ = ["build_gpt", "causal_mask", "init_model_parallel", "packed_mask", "packed_rotary", "wrap_ddp"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def init_model_parallel(tensor: int, seed: int, device: torch.device, expert: int = 1) -> None:
    """Megatron's tensor/data-parallel groups over the initialised default group (and, for MoE models, its
    expert-parallel groups: `expert` of the data-parallel ranks split each layer's experts), and its RNG streams."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    if device.type == "cpu":
        from rollart.activities.training.megatron.cpu_shims import apply_cpu_shims

        apply_cpu_shims()
    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    ps.initialize_model_parallel(tensor_model_parallel_size=tensor, expert_model_parallel_size=expert)
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
        **_moe_config(arch),
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(
            normalization="RMSNorm",
            qk_layernorm=arch.qk_norm,
            num_experts=arch.num_experts or None,
            moe_grouped_gemm=False,  # one SwiGLU MLP per local expert: what runs without Transformer Engine
        ),
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
    if arch.is_moe and ps.get_expert_model_parallel_world_size() > 1:
        from rollart.activities.training.megatron.experts import equal_tokens_over_experts

        equal_tokens_over_experts(model)  # the data ranks' micro-batches differ in shape; the all-gathers may not
    return model.to(device=device, dtype=dtype)  # torch's RMSNorm ignores params_dtype


def _moe_config(arch: HfArch) -> dict[str, Any]:
    """TransformerConfig's mixture-of-experts fields matching Qwen3-MoE's router (none for dense models).

    HF: softmax over the experts in fp32, the top k, renormalised over them when `norm_topk_prob` — which is
    megatron's top-k of the logits then a softmax over them (`pre_softmax` off); without renormalisation it is
    megatron's softmax first (`pre_softmax` on). No load-balancing loss (HF adds it only with
    `output_router_logits`, which rollart's log-probs never ask for) and no capacity limit: every token reaches its
    experts. The allgather dispatcher runs on CPUs (alltoall needs CUDA streams)."""
    if not arch.is_moe:
        return {}
    from megatron.core import parallel_state as ps

    from rollart.activities.training.megatron.cpu_shims import apply_moe_router_shim

    apply_moe_router_shim()
    return {
        "num_moe_experts": arch.num_experts,
        "moe_router_topk": arch.num_experts_per_tok,
        "moe_ffn_hidden_size": arch.moe_intermediate_size,
        "moe_grouped_gemm": False,
        "moe_router_score_function": "softmax",
        "moe_router_pre_softmax": not arch.norm_topk_prob,
        "moe_router_topk_scaling_factor": None,
        "moe_router_dtype": "fp32",
        "moe_router_load_balancing_type": "none",
        "moe_aux_loss_coeff": 0.0,
        "moe_token_dispatcher_type": "allgather",
        "moe_permute_fusion": False,
        "expert_model_parallel_size": ps.get_expert_model_parallel_world_size(),
    }


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


def packed_mask(packed: Packed) -> torch.Tensor:
    """Megatron's boolean mask (True = masked) for a packed row: block-diagonal causal, each token attending
    only to the earlier tokens of its own sequence (the local attention applies any `[1, 1, N, N]` mask)."""
    return ~packed.block_causal_mask()[None, None]


@contextmanager
def packed_rotary(gpt: Any, packed: Packed) -> Iterator[None]:
    """Rotary embeddings at each token's position within its sequence while the block runs.

    GPTModel's rotary embedding is the table of positions 0 .. N−1 (it ignores `position_ids`), so a packed
    row would rotate a sequence's tokens by where they sit in the row. A forward hook on that module picks
    each token's row of the table by its position id instead: `[N, 1, 1, d]`, one per token of the batch of 1."""
    positions = packed.position_ids[0]

    def by_position(_module: Any, _args: Any, table: torch.Tensor) -> torch.Tensor:
        return table[positions.to(table.device)]

    handle = gpt.rotary_pos_emb.register_forward_hook(by_position)
    try:
        yield
    finally:
        handle.remove()
