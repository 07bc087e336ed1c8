"""How a transformers model keeps attention within each sequence of a packed micro-batch (`trainer.packing`).

The one choice, by the model's attention implementation (`packed_attention`):
- flash-attention (`flash_attention_2`/`_3`, on a GPU with the package installed) and `rollart_varlen_sdpa`
  (ours, on CPUs): the position ids and the boundaries (`cu_seq_lens_*`). transformers hands them to
  flash-attention's varlen kernel; ours runs torch's sdpa once per sequence, causal. No mask at all, and the
  attention costs Σ lengths², as in a padded batch of equal lengths.
- `sdpa` and `eager` (any model left as loaded): an explicit block-diagonal causal 4D mask over the `[1, N]`
  row (transformers passes a 4D mask through as it is), boolean for sdpa, additive for eager. Exact, but the
  attention runs over all N² pairs and masks most of them.
The position ids restart at 0 per sequence either way, so rotary embeddings are each sequence's own.

`prepare_for_packing` picks the implementation when the policy is built: flash-attention 2 where it runs,
else `rollart_varlen_sdpa`, which on a padded micro-batch is plain sdpa with its usual mask.
"""

from __future__ import annotations

import importlib.util
import itertools
from typing import Any

import torch
import torch.nn.functional as F

from rollart.activities.rl.packing import Packed

__all__ = ["VARLEN_SDPA", "packed_attention", "prepare_for_packing", "varlen_sdpa"]

VARLEN_SDPA = "rollart_varlen_sdpa"
"""Our attention implementation for packed rows on CPUs (registered with transformers by `prepare_for_packing`)."""


def packed_attention(implementation: str, packed: Packed, dtype: torch.dtype) -> dict[str, Any]:
    """The model-call keyword arguments (besides `input_ids`) that make a model of this attention
    `implementation` attend within each packed sequence."""
    kwargs: dict[str, Any] = {"position_ids": packed.position_ids}
    if "flash" in implementation or implementation == VARLEN_SDPA:
        cu = packed.cu_seqlens.to(device=packed.input_ids.device, dtype=torch.int32)
        return kwargs | {
            "cu_seq_lens_q": cu,
            "cu_seq_lens_k": cu,
            "max_length_q": packed.max_seqlen,
            "max_length_k": packed.max_seqlen,
        }
    allowed = packed.block_causal_mask()[None, None]
    if implementation == "sdpa":
        return kwargs | {"attention_mask": allowed}
    if implementation == "eager":
        additive = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
        return kwargs | {"attention_mask": additive.masked_fill(~allowed, torch.finfo(dtype).min)}
    raise ValueError(
        f"trainer.packing: the model's attention implementation {implementation!r} has no packed path here "
        f"({VARLEN_SDPA}, sdpa, eager or flash_attention_2/3 have); load it with one of those or drop trainer.packing"
    )


def varlen_sdpa(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature (`[B, heads, T, d]` in, `[B, T, heads, d]` out). With `cu_seq_lens_q`
    (a packed row, B = 1) torch's sdpa per sequence, causal; otherwise transformers' own sdpa."""
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    if kwargs.get("sliding_window") is not None:
        raise ValueError(f"{VARLEN_SDPA} has no sliding-window attention; this model's layers use one")
    bounds = cu.tolist()
    parts = [
        F.scaled_dot_product_attention(
            query[:, :, s:e],
            key[:, :, s:e],
            value[:, :, s:e],
            dropout_p=dropout,
            is_causal=True,
            scale=scaling,
            enable_gqa=key.shape[1] != query.shape[1],
        )
        for s, e in itertools.pairwise(bounds)
    ]
    return torch.cat(parts, dim=2).transpose(1, 2).contiguous(), None


def _varlen_mask(*args: Any, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor | None:
    """sdpa's mask for a padded batch; none for a packed row (its boundaries come as `cu_seq_lens_*`), which
    spares the `[N, N]` mask transformers would otherwise derive from the position ids."""
    if attention_mask is None:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def prepare_for_packing(model: Any, device: torch.device, dtype: torch.dtype) -> str:
    """Switch `model` to the attention its packed micro-batches run best with; its name. flash-attention 2 where
    it runs (a CUDA device, 16-bit weights, `flash_attn` installed), else `rollart_varlen_sdpa`."""
    if device.type == "cuda" and dtype in (torch.bfloat16, torch.float16) and importlib.util.find_spec("flash_attn"):
        name = "flash_attention_2"
    else:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        AttentionInterface.register(VARLEN_SDPA, varlen_sdpa)
        AttentionMaskInterface.register(VARLEN_SDPA, _varlen_mask)
        name = VARLEN_SDPA
    model.set_attn_implementation(name)
    return name
