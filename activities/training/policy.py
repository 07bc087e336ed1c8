"""What a trainer backend provides on one rank: the policy's forward pass, its optimizer, its weights as HF tensors.

`train_step` is the same code for every backend (`activities.training.step`): it only talks to a
`Policy` and to the `Ranks` it runs on. A backend is a model + optimizer that can

- give per-token log-probs (and entropies) of a micro-batch, aligned with its `input_ids` like
  `rl.losses.token_logprobs`, computed however the backend shards the vocabulary;
- take one optimizer step over the gradients its micro-batches accumulated (syncing them over
  data-parallel ranks first, clipping by the *global* norm);
- hand out its weights as Hugging Face tensors, one at a time from the ranks that hold them (what
  generators load, `activities.training.publish`), take them back in (resume), and write and read its
  own checkpoints (sharded or not);
- with `trainer.lora` (the torch backend only), hand out and take in its LoRA adapter instead.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from rollart.activities.rl.action_entropy import ActionTerm
from rollart.activities.rl.batch import MicroBatch
from rollart.activities.training.precision import MasterWeights
from rollart.spec.config import TrainerConfig

__all__ = ["Policy", "StepOutcome", "worth_applying"]


@dataclass(frozen=True)
class StepOutcome:
    """What one optimizer step did: the global gradient norm, whether the update was applied, and, with
    `trainer.max_logprob_change`, how far it moved the trained tokens' log-probs and how often it was halved."""

    grad_norm: float
    applied: bool
    logprob_change: float | None = None
    shrinks: int = 0

    @property
    def without_signal(self) -> bool:
        """The gradient was exactly zero (a batch with no signal), so no update was made."""
        return self.grad_norm == 0.0


def worth_applying(grad_norm: float) -> bool:
    """Whether an optimizer step with this global gradient norm is applied.

    Not when the norm is non-finite (it would poison the weights), nor when it is exactly zero: a batch
    with no signal (every advantage 0, the bonus off for all its sequences, no KL term) would still move
    AdamW's weights by its momentum alone, up to ~lr per parameter per step in the last direction it
    took. A solved policy, whose groups all succeed, then drifts with nothing pulling it back.
    """
    return math.isfinite(grad_norm) and grad_norm > 0.0


class Policy(ABC):
    """One rank's share of a trainable policy and its optimizer (see the module docstring)."""

    pad_id: int
    """A valid token id to pad micro-batches with (padding is masked out)."""

    @abstractmethod
    def logprobs(
        self, mb: MicroBatch, *, entropy_grad: bool, actions: ActionTerm | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token log-probs (with grad) and entropies `[B, T]` of the current policy on `mb`.

        The entropy carries a gradient only when `entropy_grad` (an entropy bonus is on). With `actions` (each
        task's action space) it is the entropy over the row's env's actions (`rl.action_entropy`), not tokens.
        """

    @abstractmethod
    def ref_logprobs(self, mb: MicroBatch) -> torch.Tensor:
        """Per-token log-probs of the frozen reference policy (the job's initial model), without grad."""

    @abstractmethod
    def zero_grad(self) -> None:
        """Forget accumulated gradients (before a step's first micro-batch)."""

    @abstractmethod
    def step(self, cfg: TrainerConfig) -> StepOutcome:
        """Sync gradients over data-parallel ranks, clip by the global norm, and step AdamW with `cfg`'s
        hyper-parameters (they may change between steps). A non-finite or zero norm skips the update
        (`worth_applying`)."""

    optimizer: MasterWeights
    """The AdamW over the rank's fp32 masters (both backends step one)."""

    def remember_weights(self) -> None:
        """Keep this rank's weights as they are, before an update that may have to be scaled back."""
        self.optimizer.remember()

    def shrink_update(self, factor: float) -> None:
        """Scale this rank's update since `remember_weights` by `factor` (every rank alike: a collective decision)."""
        self.optimizer.shrink(factor)

    def forget_weights(self) -> None:
        """Drop what `remember_weights` kept, once the update is final."""
        self.optimizer.forget()

    @abstractmethod
    def hf_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy as HF `(name, tensor)` pairs (a tied head left out), each yielded by the one rank that
        publishes it; a rank may yield none. A collective: every rank must exhaust it, in step with the others.

        A tensor may be a view of live weights: take what you need of it before the next one.
        """

    @abstractmethod
    def load_hf_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Overwrite the weights with full HF tensors (as `hf_tensors` gives them), keeping the optimizer."""

    def adapter_files(self) -> dict[str, bytes]:
        """The LoRA adapter as peft's `save_pretrained` files by name (a `trainer.lora` job's published version)."""
        raise NotImplementedError(f"{type(self).__name__} trains no LoRA adapter")

    def load_adapter_blob(self, blob: bytes) -> None:
        """Overwrite the adapters with an `adapter_model.safetensors` blob, keeping the optimizer."""
        raise NotImplementedError(f"{type(self).__name__} trains no LoRA adapter")

    @abstractmethod
    def save_checkpoint(self, root: Path, step: int) -> None:
        """Checkpoint model and optimizer after train step `step` under `root` (a collective)."""

    @abstractmethod
    def load_checkpoint(self, root: Path) -> int | None:
        """Load the newest checkpoint under `root`; its step, or None when there is none."""

    @property
    @abstractmethod
    def device(self) -> torch.device:
        """Where the policy's tensors live (micro-batches are moved there)."""
