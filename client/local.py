"""The trainer's side in this process, without Temporal: its step, the weights it publishes, its logprobs.

What the trainer worker runs, called directly: for benchmarks (`python -m bench ...`), notebooks and
checks such as "does the engine's logprob of each sampled token equal the trainer's?" (the engine and
the rollout side are in `in_process`). Nothing here starts a server or a worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from rollart.contracts.activities import TrainStepInput, TrainStepResult
from rollart.infra.store.payload import Store
from rollart.infra.store.weights import WeightsSource
from rollart.spec.config import LoraConfig, TrainerConfig, WeightsConfig

if TYPE_CHECKING:
    import torch

    from rollart.activities.trainer import RankLauncher
    from rollart.activities.training.publish import Publisher

__all__ = ["LocalTrainer", "adapter_files", "lora_model", "publish_model", "published_tensors", "trainer_logprobs"]


def publish_model(
    store: Store,
    job_id: str,
    version: int,
    model: torch.nn.Module,
    weights: WeightsConfig | None = None,
    publisher: Publisher | None = None,
) -> WeightsSource:
    """Publish a transformers model's weights as `version` of `job_id` with the trainer's own code (buckets and a
    manifest; float32 unless `weights` says otherwise; with `weights.delta`, pass the same `publisher` each time);
    what an engine's `load_weights` takes. For benchmarks and checks that time or test a swap of what training
    would send."""
    from rollart.activities.rl.checkpoint_layout import checkpoint_tensors
    from rollart.activities.rl.weights_io import unique_tensors
    from rollart.activities.training.publish import Publisher, publish_version
    from rollart.activities.training.ranks import OneProcess
    from rollart.infra.store.weights import read_manifest

    cfg = (weights or WeightsConfig(dtype="float32")).resolved("float32")
    tensors = checkpoint_tensors(model, unique_tensors(model).items())
    ref = publish_version(tensors, OneProcess(), store, job_id, version, cfg, version + 1, publisher or Publisher())
    if ref is None:
        raise RuntimeError("a single process is its own leader: publishing must return the version's manifest")
    return WeightsSource(store=store.config, manifest=read_manifest(store, ref.key))


def published_tensors(store: Store, key: str) -> dict[str, torch.Tensor]:
    """Every tensor of the published version whose manifest is at `key` (a `TrainStepResult.weights_key`)."""
    from rollart.infra.store.weight_stream import read_all
    from rollart.infra.store.weights import read_manifest

    return read_all(store, read_manifest(store, key))


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
    weights: Mapping[str, torch.Tensor] | bytes | None,
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
    if isinstance(weights, bytes) and lora is not None:
        policy.load_adapter_blob(weights)
    elif weights is not None and not isinstance(weights, bytes):
        policy.load_hf_tensors(weights)
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
