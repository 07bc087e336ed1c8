"""The default trainer backend: a transformers causal LM in the trainer worker's own process, on one device.

The model is loaded from the job's HF model dir as it is (any architecture transformers knows);
weights go out as its state dict, tensor by tensor (`activities.training.publish`), checkpoints
are one safetensors file plus the optimizer state (`rl.weights_io`). With `trainer.lora` the model
is wrapped with peft's LoRA (`rl.adapter_io`): only the adapters train, sit in the optimizer, and go
out (published and checkpointed) in peft's layout; the reference policy is the same model with its
adapters switched off, so the KL term needs no second copy.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from rollart.activities.errors import bad_input
from rollart.activities.rl.action_entropy import ActionTerm, packed_by_task, token_action_entropy
from rollart.activities.rl.adapter_io import adapter_files, load_adapter_blob_into, with_lora
from rollart.activities.rl.batch import MicroBatch
from rollart.activities.rl.checkpoint_layout import checkpoint_tensors
from rollart.activities.rl.losses import (
    head_logprobs,
    head_logprobs_and_entropy,
    token_logprobs,
    token_logprobs_and_entropy,
)
from rollart.activities.rl.weights_io import load_checkpoint, load_tensors_into, save_checkpoint, unique_tensors
from rollart.activities.training.lm_head import body_and_head
from rollart.activities.training.packed_attention import packed_attention, prepare_for_packing
from rollart.activities.training.policy import Policy, StepOutcome, worth_applying
from rollart.activities.training.precision import MasterWeights, clip_scale
from rollart.spec.config import TrainerConfig

__all__ = ["TorchPolicy", "load_hf_model", "pad_token_id", "trainable_model"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_hf_model(model_dir: str | Path, dtype: torch.dtype = torch.float32) -> Any:
    """The job's initial policy, or a non-retryable error saying what is missing."""
    from transformers import AutoModelForCausalLM

    if not (Path(model_dir) / "config.json").is_file():
        raise bad_input(
            f"no model at {model_dir} (config.json missing); build one with `rollart init-model --out {model_dir}` "
            "or fix the job's model_dir"
        )
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)


def trainable_model(model: Any, model_dir: str | Path, cfg: TrainerConfig, device: torch.device) -> Any:
    """`model` made ready to train as `cfg` asks, before any sharding: the attention for packed rows, activation
    checkpointing, and peft's LoRA adapters (a model lacking a target module is a non-retryable error)."""
    dtype = _DTYPES[cfg.dtype]
    if cfg.packing is not None:  # attention per packed sequence: flash-attention's varlen kernel, else ours
        prepare_for_packing(model, device, dtype)
    if cfg.activation_checkpointing:
        model.config.use_cache = False
        model.gradient_checkpointing_enable()
        if cfg.lora is not None:  # frozen embeddings: recomputed layers still need an input that wants grads
            model.enable_input_require_grads()
    if cfg.lora is None:
        return model
    try:
        return with_lora(model, cfg.lora, f"the model in {model_dir}")
    except ValueError as e:
        raise bad_input(str(e)) from e


def pad_token_id(config: Any) -> int:
    """A valid token id to pad micro-batches with (padding is masked out): the model's pad, else its eos, else 0."""
    return next((i for i in (config.pad_token_id, config.eos_token_id) if isinstance(i, int)), 0)


class TorchPolicy(Policy):
    """A transformers model and its AdamW (fp32 masters when computing in bf16) on `device`."""

    def __init__(self, model_dir: str | Path, cfg: TrainerConfig, device: torch.device) -> None:
        self.model_dir = str(model_dir)
        self._device = device
        self.dtype = _DTYPES[cfg.dtype]
        self.lora = cfg.lora is not None
        model = trainable_model(load_hf_model(model_dir).to(device=device, dtype=self.dtype), model_dir, cfg, device)
        model.train()
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = MasterWeights(self.params, cfg)
        self.pad_id = pad_token_id(model.config)
        self._ref: Any = None
        self.logprob_chunk_tokens = cfg.logprob_chunk_tokens

    @property
    def device(self) -> torch.device:
        return self._device

    def _run(self, model: Any, mb: MicroBatch) -> Any:
        """The one model call, on `mb`'s padded rows, or on its packed row with the attention kept within each
        sequence (`packed_attention`); `model` is the causal LM (`.logits`) or its decoder (`.last_hidden_state`)."""
        if mb.packed is None:
            return model(input_ids=mb.input_ids, attention_mask=mb.attention_mask)
        kwargs = packed_attention(self.model.config._attn_implementation, mb.packed, self.dtype)
        return model(input_ids=mb.packed.input_ids, **kwargs)

    def _token_values(
        self, model: Any, mb: MicroBatch, *, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`model`'s log-probs (and entropies) of `mb`'s tokens, aligned with `mb.model_ids`, never holding the
        whole fp32 `[tokens, vocabulary]` block: fused with the LM head where `body_and_head` allows, else from the
        logits, `logprob_chunk_tokens` at a time."""
        ids, chunk = mb.model_ids, self.logprob_chunk_tokens
        fused = body_and_head(model)
        if fused is None:
            logits = self._run(model, mb).logits
            if with_entropy:
                return token_logprobs_and_entropy(logits, ids, chunk)
            return token_logprobs(logits, ids, chunk), None
        body, head = fused
        hidden = self._run(body, mb).last_hidden_state
        if with_entropy:
            return head_logprobs_and_entropy(hidden, head.weight, head.bias, ids, chunk)
        return head_logprobs(hidden, head.weight, head.bias, ids, chunk), None

    def logprobs(
        self, mb: MicroBatch, *, entropy_grad: bool, actions: ActionTerm | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if actions is not None:  # the entropy over the env's actions reads whole logits
            return self.from_logits(self._run(self.model, mb).logits, mb, entropy_grad=entropy_grad, actions=actions)
        logp, entropy = self._token_values(self.model, mb, with_entropy=True)
        assert entropy is not None
        return mb.unpacked(logp), mb.unpacked(entropy if entropy_grad else entropy.detach())

    def from_logits(
        self, logits: torch.Tensor, mb: MicroBatch, *, entropy_grad: bool, actions: ActionTerm | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`logprobs` from the model's logits of `mb` (`[B, T, V]`, or `[1, N, V]` of its packed row: the values
        are then unpacked to `[B, T]`), the entropy over the env's actions with `actions`."""
        ids, chunk = mb.model_ids, self.logprob_chunk_tokens
        if actions is None:
            logp, entropy = token_logprobs_and_entropy(logits, ids, chunk)
            return mb.unpacked(logp), mb.unpacked(entropy if entropy_grad else entropy.detach())
        logp = token_logprobs(logits, ids, chunk)
        z = logits if entropy_grad else logits.detach()
        if mb.packed is None:
            entropy = token_action_entropy(z, mb.tasks, actions)
        else:
            entropy = packed_by_task(mb.packed, mb.tasks, lambda t: token_action_entropy(z, (t,), actions))
        return mb.unpacked(logp), mb.unpacked(entropy)

    def ref_logprobs(self, mb: MicroBatch) -> torch.Tensor:
        if self.lora:  # the base model is the reference: the same weights with the adapters off
            with torch.no_grad(), self.model.disable_adapter():
                return mb.unpacked(self._token_values(self.model, mb, with_entropy=False)[0])
        if self._ref is None:  # the frozen initial policy, loaded only when the KL term is on
            ref = load_hf_model(self.model_dir).to(device=self._device, dtype=self.dtype).eval()
            for p in ref.parameters():
                p.requires_grad_(False)
            if self.model.config._attn_implementation != ref.config._attn_implementation:
                ref.set_attn_implementation(self.model.config._attn_implementation)
            self._ref = ref
        with torch.no_grad():
            return mb.unpacked(self._token_values(self._ref, mb, with_entropy=False)[0])

    def zero_grad(self) -> None:
        self.model.zero_grad(set_to_none=True)

    def step(self, cfg: TrainerConfig) -> StepOutcome:
        grads = [p.grad for p in self.params]
        present = [g for g in grads if g is not None]
        norm = float(torch.linalg.vector_norm(torch.stack([g.float().norm() for g in present]))) if present else 0.0
        applied = worth_applying(norm)
        if applied:
            self.optimizer.step(grads, cfg, clip_scale(norm, cfg.grad_clip))
        self.zero_grad()
        return StepOutcome(grad_norm=norm, applied=applied)

    def hf_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield from checkpoint_tensors(self.model, unique_tensors(self.model).items())

    def load_hf_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        load_tensors_into(self.model, tensors)
        self.optimizer.sync_from_params()

    def adapter_files(self) -> dict[str, bytes]:
        if not self.lora:
            return super().adapter_files()
        return adapter_files(self.model)

    def load_adapter_blob(self, blob: bytes) -> None:
        if not self.lora:
            super().load_adapter_blob(blob)
        load_adapter_blob_into(self.model, blob)
        self.optimizer.sync_from_params()

    def save_checkpoint(self, root: Path, step: int) -> None:
        save_checkpoint(root, self.model, self.optimizer, step)

    def load_checkpoint(self, root: Path) -> int | None:
        return load_checkpoint(root, self.model, self.optimizer)
