"""The trainer's side in this process, without Temporal: its step, the weights it publishes, its logprobs.

What the trainer worker runs, called directly: for benchmarks (`python -m bench ...`), notebooks and
checks such as "does the engine's logprob of each sampled token equal the trainer's?" (the engine and
the rollout side are in `in_process`). Nothing here starts a server or a worker.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rollart.contracts.activities import TrainStepInput, TrainStepResult
from rollart.infra.config import LoraConfig, TrainerConfig
from rollart.infra.store.payload import Store

if TYPE_CHECKING:
    import torch

    from rollart.activities.trainer import RankLauncher

__all__ = ["LocalTrainer", "adapter_files", "lora_model", "trainer_logprobs", "weights_blob"]


def weights_blob(model: torch.nn.Module) -> bytes:
    """A transformers model's weights as the trainer publishes them: float32 safetensors, a tied head left out.

    What `Engine.load_weights` and the store's published versions hold, so a benchmark can time a
    swap of exactly what training would send.
    """
    from rollart.activities.rl.weights_io import state_dict_blob

    return state_dict_blob(model)


def lora_model(model: torch.nn.Module, lora: LoraConfig) -> torch.nn.Module:
    """A transformers model wrapped with fresh LoRA adapters (B = 0), as a `trainer.lora` trainer wraps it."""
    from rollart.activities.rl.adapter_io import with_lora

    return with_lora(model, lora)


def adapter_files(model: torch.nn.Module) -> dict[str, bytes]:
    """A `lora_model`'s adapter as a `trainer.lora` trainer publishes it: peft's files by name."""
    from rollart.activities.rl.adapter_io import adapter_files as files

    return files(model)


def trainer_logprobs(
    model_dir: Path,
    weights: bytes | None,
    sequences: list[tuple[list[int], list[int]]],
    device: str = "cpu",
    lora: LoraConfig | None = None,
) -> list[list[float]]:
    """The torch trainer's logprob of each completion token after its prompt, under `weights` (None: the model dir's).

    `sequences` are (prompt ids, completion ids) pairs; compare the result with an engine's logprobs
    to check that generation and training agree on the policy. With `lora`, `weights` is a published
    adapter (`adapter_model.safetensors`) on the model dir's weights.
    """
    import torch

    from rollart.activities.rl.batch import TrainSequence, collate
    from rollart.activities.training.torch_policy import TorchPolicy

    policy = TorchPolicy(model_dir, TrainerConfig(lora=lora), torch.device(device))
    policy.model.eval()  # no adapter dropout: the policy as engines serve it
    if weights is not None and lora is not None:
        policy.load_adapter_blob(weights)
    elif weights is not None:
        policy.load_weights_blob(weights)
    seqs = [TrainSequence(list(p), list(c), [0.0] * len(c), 0.0) for p, c in sequences]
    with torch.no_grad():
        lp, _ = policy.logprobs(collate(seqs, policy.pad_id).to(policy.device), entropy_grad=False)
    return [lp[i, len(s.prompt_ids) : s.length].cpu().tolist() for i, s in enumerate(seqs)]


class LocalTrainer:
    """The `train_step` activity in this process: the torch backend here, or megatron on the `ranks` given.

    Why: a benchmark or a notebook trains exactly as the trainer worker does (the same idempotent
    step, records, checkpoints and published weights) without a Temporal server. For megatron pass
    the trainer worker's rank group (`rollart.workers.trainer_ranks.RankGroup`); closing it is yours.
    """

    def __init__(self, store: Store, *, ranks: RankLauncher | None = None, keep_weight_versions: int = 2) -> None:
        from temporalio.testing import ActivityEnvironment

        from rollart.activities.trainer import TrainerActivities

        self._activities = TrainerActivities(store, ranks=ranks, keep_weight_versions=keep_weight_versions)
        self._env = ActivityEnvironment()

    async def step(self, inp: TrainStepInput) -> TrainStepResult:
        """Run train step `inp.step` (or return its recorded result), as the `trainer` pool's worker would."""
        return await self._env.run(self._activities.train_step, inp)
