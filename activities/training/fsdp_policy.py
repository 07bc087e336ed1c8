"""The torch backend sharded with FSDP2: one rank's share of a transformers model and of its optimizer.

Every rank loads the HF model, then each decoder layer and the root are `fully_shard`ed over the whole
world (one data-parallel group): parameters, gradients and AdamW's state live as 1/N shards (DTensors),
a layer's weights are gathered for its forward and backward only. Gradients are reduce-scattered by FSDP
as the *sum* over ranks (the loss is already normalised by the whole batch's tokens), clipped by the global
norm (every element lives in one shard, so each is counted once), and AdamW steps each rank's shards —
element-wise, so it equals AdamW over the whole model. With `dtype: bfloat16` the shards stay fp32 (they
are the master weights) and FSDP casts them to bf16 for compute (`MixedPrecisionPolicy`).

Forward passes are collectives (the all-gathers), so every rank must run as many: `activities.training.
lockstep` pads a pass with no-loss micro-batches (`FsdpRanks.forward_in_lockstep`). Weights go out one
tensor at a time, gathered (`full_tensor`) and yielded by rank 0 only; checkpoints are sharded with
torch.distributed.checkpoint (`fsdp_checkpoint`) and resume at another world size. With `trainer.lora`
peft wraps the model before it is sharded; only the adapters train, and they go out gathered by rank 0
(`fsdp_lora`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, distribute_tensor

from rollart.activities.errors import bad_input
from rollart.activities.rl.batch import MicroBatch
from rollart.activities.rl.checkpoint_layout import assemble, checkpoint_tensors
from rollart.activities.training.fsdp_checkpoint import load_dcp, save_dcp
from rollart.activities.training.fsdp_lora import load_sharded_adapter, sharded_adapter_files
from rollart.activities.training.policy import StepOutcome, worth_applying
from rollart.activities.training.precision import MasterWeights, clip_scale
from rollart.activities.training.torch_policy import TorchPolicy, load_hf_model, pad_token_id, trainable_model
from rollart.spec.config import TrainerConfig

__all__ = ["FsdpPolicy", "decoder_layers", "shard_model"]


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks (what HF never splits across devices: `_no_split_modules`), in order."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise bad_input(
            f"trainer.fsdp: cannot find the decoder layers of {type(model).__name__} (its _no_split_modules "
            f"{sorted(names)} name no submodule); train it without fsdp"
        )
    return layers


def shard_model(model: torch.nn.Module, cfg: TrainerConfig, device: torch.device) -> Any:
    """`model` with each decoder layer, then the root, `fully_shard`ed over the whole world; gradients summed."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if cfg.fsdp is None:
        raise ValueError("shard_model needs trainer.fsdp")
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    mp = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if cfg.dtype == "bfloat16" else None, reduce_dtype=torch.float32
    )
    reshard = cfg.fsdp.reshard_after_forward
    for layer in reversed(decoder_layers(model)):  # innermost first, as FSDP2 wants nested modules
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    for m in model.modules():
        if isinstance(m, FSDPModule):  # the loss is normalised by the whole batch: sum the shares, do not average
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)  # a plain SUM (a divide factor is a PREMUL_SUM: not on gloo)
    return model


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's slice of a sharded tensor (a plain tensor as it is)."""
    return t.to_local() if isinstance(t, DTensor) else t


class FsdpPolicy(TorchPolicy):
    """One rank of a `trainer.fsdp` torch trainer; expects the default process group to be initialised.

    The forward pass and log-probs are TorchPolicy's (the sharded model is called like the plain one)."""

    def __init__(self, model_dir: str | Path, cfg: TrainerConfig, device: torch.device) -> None:
        self.model_dir = str(model_dir)
        self.cfg = cfg
        self._device = device
        self.dtype = torch.bfloat16 if cfg.dtype == "bfloat16" else torch.float32  # compute (the shards stay fp32)
        self.lora = cfg.lora is not None
        # on the CPU (`fully_shard` moves each layer to `device` as it shards it); peft wraps first, then FSDP
        # shards base and adapters alike
        model = trainable_model(load_hf_model(model_dir), model_dir, cfg, device)
        self.model = shard_model(model, cfg, device)
        self.model.train()
        self.rank = dist.get_rank()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = MasterWeights(self.params, cfg)
        self.pad_id = pad_token_id(model.config)
        self._ref: Any = None
        self.logprob_chunk_tokens = cfg.logprob_chunk_tokens

    def ref_logprobs(self, mb: MicroBatch) -> torch.Tensor:
        # the frozen initial policy, sharded like the trained one (with LoRA: the model with its adapters off)
        if self._ref is None and not self.lora:
            ref = load_hf_model(self.model_dir)
            if ref.config._attn_implementation != self.model.config._attn_implementation:  # packing's
                ref.set_attn_implementation(self.model.config._attn_implementation)
            for p in ref.parameters():
                p.requires_grad_(False)
            self._ref = shard_model(ref, self.cfg, self._device).eval()
        return super().ref_logprobs(mb)

    def _resharded(self) -> None:
        """Drop gathered weights before the shards change in place. With `reshard_after_forward: false` a no-grad
        forward (proximal log-probs, the trust region's measure) leaves each layer's weights gathered, and FSDP
        would run the next forward on those, stale, instead of gathering the updated shards."""
        for m in self.model.modules():
            if isinstance(m, FSDPModule):
                m.reshard()

    def step(self, cfg: TrainerConfig) -> StepOutcome:
        self._resharded()
        grads = [p.grad for p in self.params]
        sq = torch.zeros((), dtype=torch.float64, device=self._device)
        for g in grads:
            if g is not None:
                sq += _local(g).double().pow(2).sum()
        dist.all_reduce(sq)  # each element lives in exactly one rank's shard
        norm = float(sq.sqrt())
        applied = worth_applying(norm)
        if applied:
            self.optimizer.step(grads, cfg, clip_scale(norm, cfg.grad_clip))
        self.zero_grad()
        return StepOutcome(grad_norm=norm, applied=applied)

    def shrink_update(self, factor: float) -> None:
        self._resharded()
        super().shrink_update(factor)

    def _named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The state dict's tensors (the shards) once each (a tied head, the same parameter, left out), in HF order."""
        self._resharded()
        seen: set[int] = set()
        for name, t in self.model.state_dict(keep_vars=True).items():
            if id(t) not in seen:
                seen.add(id(t))
                yield name, t

    def hf_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, t in self._named_tensors():
            full = t.full_tensor() if isinstance(t, DTensor) else t  # an all-gather of this tensor alone
            if self.rank == 0:
                yield from checkpoint_tensors(self.model, [(name, full.detach())])
            del full

    def load_hf_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        tensors = assemble(self.model, {name: t.shape for name, t in self._named_tensors()}, tensors)
        with torch.no_grad():
            for name, t in self._named_tensors():
                if name not in tensors:
                    raise ValueError(f"HF tensors lack {name!r}: not weights of this model")
                full = tensors[name].to(device=self._device, dtype=t.dtype)
                if isinstance(t, DTensor):  # each rank cuts its own shard of the full tensor: no communication
                    t.copy_(distribute_tensor(full, t.device_mesh, t.placements, src_data_rank=None))
                else:
                    t.copy_(full)
        self.optimizer.sync_from_params()

    def adapter_files(self) -> dict[str, bytes]:
        """The adapter's files on rank 0 ({} on the others: rank 0 publishes); a collective."""
        if not self.lora:
            return super().adapter_files()
        self._resharded()
        return sharded_adapter_files(self.model, self.rank == 0)

    def load_adapter_blob(self, blob: bytes) -> None:
        if not self.lora:
            super().load_adapter_blob(blob)
        self._resharded()
        load_sharded_adapter(self.model, blob)
        self.optimizer.sync_from_params()

    def save_checkpoint(self, root: Path, step: int) -> None:
        self._resharded()
        save_dcp(root, step, self.model, self.optimizer.optimizer)

    def load_checkpoint(self, root: Path) -> int | None:
        self._resharded()
        return load_dcp(root, self.model, self.optimizer.optimizer)
