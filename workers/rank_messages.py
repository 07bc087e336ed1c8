"""What the trainer worker (the ranks' agent) and its rank processes say to each other, and where.

They talk through the rendezvous TCPStore that node 0's agent hosts (torch.distributed's key-value
store: the same one the ranks' process group rendezvous through). Every launch of the ranks is a
*generation* with its own key prefix, so a restarted group never reads a dead one's messages:

  gen                       the current generation's id (followers watch it)
  <gen>/launch              LaunchSpec: which job, model, run dir, trainer settings, world size
  <gen>/pg/...              the ranks' process-group rendezvous
  <gen>/ready               count of ranks that have loaded the policy and resumed
  <gen>/cmd/<n>             RankCommand n (train a step, or stop)
  <gen>/result/<n>          rank 0's RankReply to command n
  <gen>/failed              RankError: a rank or a node failed; the generation is over
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from rollart.contracts.activities import TrainStepInput, TrainStepResult
from rollart.spec.config import StoreConfig, TrainerConfig

__all__ = ["LaunchSpec", "RankCommand", "RankError", "RankReply", "key"]


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def key(gen: str, *parts: object) -> str:
    """A key of generation `gen`."""
    return "/".join([gen, *(str(p) for p in parts)])


class LaunchSpec(_Message):
    """Everything a rank needs to build its share of a job's policy."""

    job_id: str
    model_dir: str
    run_dir: str
    trainer: TrainerConfig
    store: StoreConfig
    keep_weight_versions: int
    nnodes: int
    rdzv: str
    """HOST:PORT of the TCPStore (node 0's agent)."""

    @property
    def world_size(self) -> int:
        """Ranks in all: megatron's tensor × data, or the torch backend's `fsdp.ranks`."""
        return self.trainer.ranks

    @property
    def per_node(self) -> int:
        """Ranks each node runs."""
        return self.world_size // self.nnodes

    def same_ranks(self, other: LaunchSpec) -> bool:
        """Whether ranks launched for `other` can run this spec's steps (same job, model and layout)."""
        layout = ("backend", "parallel", "fsdp", "device", "dtype", "activation_checkpointing", "seed")
        return (self.job_id, self.model_dir, self.run_dir, self.store) == (
            other.job_id,
            other.model_dir,
            other.run_dir,
            other.store,
        ) and all(getattr(self.trainer, f) == getattr(other.trainer, f) for f in layout)


class RankCommand(_Message):
    """Train one step, or stop."""

    op: Literal["train", "stop"]
    step: TrainStepInput | None = None


class RankError(_Message):
    """Why a rank failed; `non_retryable` for what a restart cannot fix (bad input, a model it cannot train).

    `cause` is the exception as `Type: text` (no rank number): the agent compares it across attempts of a step.
    """

    type: str
    message: str
    non_retryable: bool = False
    cause: str = ""


class RankReply(_Message):
    """Rank 0's answer to a command: the step's result, or the error every rank agreed on."""

    result: TrainStepResult | None = None
    error: RankError | None = None
