"""The decoder and LM head of a transformers causal LM, for log-probs fused with the head (`rl.chunked_logprobs`).

Why: the head's `[tokens, vocabulary]` logits are the largest tensor of a train step (8k tokens × a 152k vocabulary
is ~5 GB in fp32). Run the decoder alone and hand its last hidden states and the head's weight to
`head_logprobs_and_entropy`, and the logits are made a chunk at a time and never whole. That is exact only for
models whose logits are `lm_head(last hidden state)` with nothing after it, so the families are listed, and any
other model (a logit soft-cap, a logit scale, an unknown family) keeps the whole-logits path.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["FUSED_HEAD_MODELS", "body_and_head"]

FUSED_HEAD_MODELS = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen3_moe"})
"""Model types whose logits are exactly `lm_head(last hidden state)`: no soft-cap, no scale, no bias trick."""


def body_and_head(model: Any) -> tuple[Any, torch.nn.Linear] | None:
    """The decoder (called like the model, it returns `last_hidden_state`) and the LM head of `model` (a peft
    model's too: its LoRA layers live inside the decoder), or None where the fused path is not known to be exact:
    another family, a head that is not a plain Linear (LoRA on the head), or a sharded head (FSDP2: calling the
    decoder alone would skip the root module's parameter gathering)."""
    from peft import PeftModel
    from torch.distributed.tensor import DTensor

    base = model.get_base_model() if isinstance(model, PeftModel) else model
    if getattr(base.config, "model_type", None) not in FUSED_HEAD_MODELS:
        return None
    head = base.get_output_embeddings()  # tied: the embedding's Parameter, so its two gradients add up
    body = getattr(base, "model", None)
    if type(head) is not torch.nn.Linear or isinstance(head.weight, DTensor) or body is None:
        return None
    return body, head
