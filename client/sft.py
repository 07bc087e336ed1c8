"""`rollart sft`'s work: a job's model fine-tuned on chat transcripts in this process, written as a model dir.

The transcripts are tokenized as generation builds a conversation (`activities.training.sft_data`), trained with
the job's trainer section and backend (`activities.training.sft`; megatron on one rank), and the result is written like
`rollart export` writes a version: the job's config, tokenizer (chat template included) and generation config
with the trained weights — a model dir an RL job names as its `model_dir`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollart.activities.training.sft import SftOptions, SftProgress, SftResult
from rollart.activities.training.sft_data import SftSequence
from rollart.spec.config import JobSpec, TrainerConfig

if TYPE_CHECKING:
    from rollart.activities.training.policy import Policy

__all__ = ["SftPlan", "SftRun", "plan_sft", "run_sft", "write_synthetic"]


@dataclass(frozen=True)
class SftPlan:
    """What a run will do, known before it trains: the tokenized transcripts and the step count."""

    sequences: list[SftSequence]
    options: SftOptions
    trainer: TrainerConfig

    @property
    def tokens(self) -> int:
        return sum(len(s.ids) for s in self.sequences)

    @property
    def trained_tokens(self) -> int:
        return sum(s.trained_tokens for s in self.sequences)


@dataclass(frozen=True)
class SftRun:
    """A finished run: the training's outcome and the model dir written."""

    result: SftResult
    out: Path


def plan_sft(
    job: JobSpec,
    data: Path,
    *,
    steps: int | None = None,
    epochs: float | None = None,
    batch_size: int = 32,
    lr: float | None = None,
    seed: int = 0,
    checkpoint_every: int = 0,
) -> SftPlan:
    """Read and tokenize `data` for `job`'s model; the steps are `steps`, or `epochs` passes (default 1).

    ValueError (naming the line) for a bad transcript, a backend SFT does not run on, or a conversation longer
    than the model's context.
    """
    from rollart.activities.engines.conversation import ChatTokens
    from rollart.activities.training.sft_data import read_transcripts, tokenize_transcript

    trainer = job.trainer
    if trainer.backend == "megatron" and trainer.parallel.world_size > 1:
        raise ValueError(
            f"rollart sft runs the megatron backend on one rank, in this process; this job's trainer.parallel is "
            f"tensor {trainer.parallel.tensor} x data {trainer.parallel.data}. SFT with a copy of the job whose "
            "trainer.parallel is 1 x 1 (or backend: torch): the output is an HF model dir either backend loads"
        )
    if steps is not None and epochs is not None:
        raise ValueError("give --steps or --epochs, not both")
    if batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {batch_size}")
    chat = ChatTokens(job.model_dir)
    limit = _context_length(job.model_dir)
    sequences = []
    for n, transcript in enumerate(read_transcripts(data), start=1):
        seq = tokenize_transcript(chat, transcript)
        if limit is not None and len(seq.ids) > limit:
            raise ValueError(f"{data}: transcript {n} is {len(seq.ids)} tokens, past the model's context of {limit}")
        sequences.append(seq)
    if steps is None:
        steps = math.ceil((1.0 if epochs is None else epochs) * len(sequences) / batch_size)
    if steps < 1:
        raise ValueError(f"the run must make at least one step, got {steps} (--steps, or --epochs x transcripts)")
    if lr is not None:
        trainer = trainer.model_copy(update={"lr": lr})
    options = SftOptions(steps=steps, batch_size=batch_size, seed=seed, checkpoint_every=checkpoint_every)
    return SftPlan(sequences=sequences, options=options, trainer=TrainerConfig.model_validate(trainer.model_dump()))


def run_sft(
    job: JobSpec, plan: SftPlan, out: Path, run_dir: Path, on_step: Callable[[SftProgress], None] | None = None
) -> SftRun:
    """Train as `plan` says (resuming `run_dir`'s checkpoint if any), then write the model dir `out`."""
    from rollart.activities.training.sft import train_sft
    from rollart.activities.training.torch_policy import TorchPolicy
    from rollart.client.snapshots import PolicySnapshot, export

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} exists and is not an empty directory; choose another --out or remove it")
    cfg = plan.trainer
    with _policy(job.model_dir, cfg) as policy:
        result = train_sft(policy, cfg, plan.sequences, plan.options, Path(run_dir), on_step)
        version = plan.options.steps
        if isinstance(policy, TorchPolicy) and policy.lora:  # merged: RL starts from a plain model
            snapshot = PolicySnapshot(version, "sft", adapter=policy.adapter_files())
            written = export(job.model_dir, snapshot, out, merge=True)
        else:
            weights = {name: t.detach().to("cpu", copy=True) for name, t in policy.hf_tensors()}
            written = export(job.model_dir, PolicySnapshot(version, "sft", weights=weights), out)
    return SftRun(result=result, out=written)


@contextmanager
def _policy(model_dir: Path, cfg: TrainerConfig) -> Iterator[Policy]:
    """The job's trainer backend in this process: the torch policy, or megatron's on a one-rank process group
    (set up here and torn down after, so the caller's process is left as it was)."""
    import torch

    from rollart.activities.training.devices import resolve_device

    device = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)
    if cfg.backend == "torch":
        from rollart.activities.training.torch_policy import TorchPolicy

        yield TorchPolicy(model_dir, cfg, device)
        return
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from rollart.activities.training.megatron.model import init_model_parallel
    from rollart.activities.training.megatron.policy import MegatronPolicy

    if dist.is_initialized():
        raise ValueError("this process already has a torch.distributed group; run rollart sft in a process of its own")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        init_model_parallel(1, cfg.seed, device)
        torch.manual_seed(cfg.seed)
        yield MegatronPolicy(model_dir, cfg, device)
    finally:
        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        dist.destroy_process_group()


def write_synthetic(generator: str, n: int, seed: int, out: Path, env_args: dict[str, Any]) -> int:
    """Write `n` synthetic transcripts of `generator` (`rollart sft-data`) to `out`, one a line; how many.

    ValueError for an unknown generator or env_args it refuses.
    """
    from rollart.activities.training.sft_synthetic import GENERATORS

    if generator not in GENERATORS:
        raise ValueError(f"no transcript generator {generator!r}; there are: {', '.join(sorted(GENERATORS))}")
    lines = [json.dumps(t) for t in GENERATORS[generator](n, seed, **env_args)]
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text("\n".join(lines) + "\n")
    return len(lines)


def _context_length(model_dir: Path) -> int | None:
    """The model's context (config.json's max_position_embeddings), if it says."""
    try:
        value = json.loads((Path(model_dir) / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError):
        return None
    return value if isinstance(value, int) else None
