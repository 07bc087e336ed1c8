"""The megatron trainer backend on one rank: a GPTModel shard, megatron's DDP, AdamW over the shard.

Built from the job's HF model dir (weights converted on load), it trains with tensor parallelism
(the vocabulary too: log-probs never gather it) and data parallelism (megatron's DDP sums the
fp32 gradient buffers over data-parallel ranks), clips by the global norm (each tensor-parallel
shard counted once, replicated norms once), and steps a plain torch AdamW over each rank's shard —
element-wise, so it equals AdamW over the whole model. Weights go out as HF tensors, each decoder layer
gathered to one tensor-parallel rank in turn (`hf_tensors`; published in buckets by every such rank);
checkpoints are sharded, one file per tensor-parallel rank. A mixture-of-experts model (Qwen3-MoE) splits
each layer's experts over `parallel.expert` of the data-parallel ranks; each expert is published,
checkpointed and counted in the gradient norm by the one rank that holds its first copy (`experts`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rollart.activities.rl.action_entropy import ActionTerm, packed_by_task
from rollart.activities.rl.batch import MicroBatch
from rollart.activities.rl.weights_io import hf_model_tensors
from rollart.activities.training.megatron.checkpoint import load_sharded, save_sharded
from rollart.activities.training.megatron.convert import hf_of, hf_to_megatron, megatron_to_hf
from rollart.activities.training.megatron.experts import (
    expert_flags,
    gather_experts_hf,
    is_expert,
    local_experts_hf,
    squared_norm,
)
from rollart.activities.training.megatron.hf_layout import HfArch
from rollart.activities.training.megatron.model import build_gpt, causal_mask, packed_mask, packed_rotary, wrap_ddp
from rollart.activities.training.megatron.vocab_parallel import (
    vocab_parallel_action_entropy,
    vocab_parallel_logprobs_and_entropy,
)
from rollart.activities.training.policy import Policy, StepOutcome, worth_applying
from rollart.activities.training.precision import MasterWeights, clip_scale
from rollart.spec.config import TrainerConfig

__all__ = ["MegatronPolicy"]


class MegatronPolicy(Policy):
    """One rank's GPTModel shard and optimizer; expects the process group and megatron's groups to be set up
    (`model.init_model_parallel`)."""

    def __init__(self, model_dir: str | Path, cfg: TrainerConfig, device: torch.device) -> None:
        from megatron.core import parallel_state as ps

        self.model_dir = str(model_dir)
        self.cfg = cfg
        self._device = device
        self.arch = HfArch.from_model_dir(model_dir)
        self.tp = ps.get_tensor_model_parallel_world_size()
        self.tp_rank = ps.get_tensor_model_parallel_rank()
        self.arch.check_tensor_parallel(self.tp)
        self.ep = ps.get_expert_model_parallel_world_size()
        self.ep_rank = ps.get_expert_model_parallel_rank()
        self.arch.check_expert_parallel(self.ep)
        self.pad_id = self.arch.pad_token_id
        self.module = build_gpt(self.arch, cfg, device)
        self._load_hf_dir(self.module)
        self.ddp = wrap_ddp(self.module)
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        self._expert = expert_flags(self.module)  # per param: an expert of this rank's (MoE), summed over EP
        self.optimizer = MasterWeights(self.params, cfg)
        self._ref: Any = None
        self._grads_synced = False

    @property
    def device(self) -> torch.device:
        return self._device

    # ---- weights in -----------------------------------------------------------------------------

    def _load_shard(self, module: Any, get: Any) -> None:
        shard = hf_to_megatron(get, self.arch, self.tp, self.tp_rank, self.ep, self.ep_rank)
        missing, unexpected = module.load_state_dict(shard, strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state")]
        if missing or unexpected:
            raise ValueError(
                f"HF → megatron conversion does not fit the GPTModel: missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}"
            )

    def _load_hf_dir(self, module: Any) -> None:
        with hf_model_tensors(self.model_dir) as get:
            self._load_shard(module, get)

    def load_hf_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self._load_shard(self.module, lambda name: tensors[name].float())
        self.optimizer.sync_from_params()

    # ---- forward / backward ---------------------------------------------------------------------

    def _logits(self, model: Any, mb: MicroBatch, gpt: Any) -> torch.Tensor:
        """This rank's vocabulary slice of the logits of `mb`: `[B, T, V/tp]` of its padded rows, or `[1, N,
        V/tp]` of its packed row (block-diagonal causal mask, rotary at each token's position in its sequence).
        `gpt` is the GPTModel that `model` runs (itself, or the one megatron's DDP wraps)."""
        if mb.packed is not None:
            packed = mb.packed
            with packed_rotary(gpt, packed):
                return model(packed.input_ids, packed.position_ids, packed_mask(packed))
        b, t = mb.input_ids.shape
        positions = torch.arange(t, device=self._device).unsqueeze(0).expand(b, t)
        return model(mb.input_ids, positions, causal_mask(t, self._device))

    def _vocab_start(self) -> int:
        return self.tp_rank * self.arch.padded_vocab(self.tp) // self.tp

    def logprobs(
        self, mb: MicroBatch, *, entropy_grad: bool, actions: ActionTerm | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self._logits(self.ddp, mb, self.module)
        # over actions, the token entropy is replaced below: it needs no graph
        logp, entropy = vocab_parallel_logprobs_and_entropy(
            logits,
            mb.model_ids,
            self._vocab_start(),
            self.arch.vocab_size,
            entropy_grad=entropy_grad and actions is None,
            chunk_tokens=self.cfg.logprob_chunk_tokens,
        )
        if actions is not None:
            z = logits if entropy_grad else logits.detach()
            start, size = self._vocab_start(), self.arch.vocab_size
            if mb.packed is None:
                entropy = vocab_parallel_action_entropy(z, mb.tasks, actions, start, size)
            else:
                entropy = packed_by_task(
                    mb.packed, mb.tasks, lambda t: vocab_parallel_action_entropy(z, (t,), actions, start, size)
                )
        return mb.unpacked(logp), mb.unpacked(entropy)

    def ref_logprobs(self, mb: MicroBatch) -> torch.Tensor:
        if self._ref is None:  # the frozen initial policy, built only when the KL term is on
            ref = build_gpt(self.arch, self.cfg, self._device).eval()
            self._load_hf_dir(ref)
            for p in ref.parameters():
                p.requires_grad_(False)
            self._ref = ref
        with torch.no_grad():
            logits = self._logits(self._ref, mb, self._ref)
            logp, _ = vocab_parallel_logprobs_and_entropy(
                logits,
                mb.model_ids,
                self._vocab_start(),
                self.arch.vocab_size,
                entropy_grad=False,
                chunk_tokens=self.cfg.logprob_chunk_tokens,
            )
        return mb.unpacked(logp)

    def zero_grad(self) -> None:
        self.ddp.zero_grad_buffer()
        self.module.zero_grad(set_to_none=True)
        self._grads_synced = False

    def sync_grads(self) -> None:
        """Sum the accumulated gradients (`main_grad`) over data-parallel ranks; once per step (a collective)."""
        from megatron.core.distributed import finalize_model_grads

        if not self._grads_synced:
            finalize_model_grads([self.ddp])
            self._grads_synced = True

    def step(self, cfg: TrainerConfig) -> StepOutcome:
        self.sync_grads()
        grads = [p.main_grad for p in self.params]
        norm = self._global_norm(grads)
        applied = worth_applying(norm)
        if applied:
            self.optimizer.step(grads, cfg, clip_scale(norm, cfg.grad_clip))
        self.zero_grad()
        return StepOutcome(grad_norm=norm, applied=applied)

    def _global_norm(self, grads: list[torch.Tensor]) -> float:
        """‖g‖ of the whole model: each tensor-parallel shard once, replicated tensors (norms) once, each expert
        once (from the expert-parallel rank that holds it)."""
        from megatron.core import parallel_state as ps
        from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

        counted = [param_is_not_tensor_parallel_duplicate(p) for p in self.params]
        sq = squared_norm(grads, self._expert, counted)
        if self.tp > 1:
            dist.all_reduce(sq, group=ps.get_tensor_model_parallel_group())
        return float(sq.sqrt())

    # ---- weights out ----------------------------------------------------------------------------

    def gathered_hf(self, grads: bool = False) -> dict[str, torch.Tensor] | None:
        """The full model (or its gradients) as float32 HF tensors on the leader; None on other ranks.

        A collective of the ranks of data-parallel group 0 (they hold every shard), and for MoE of the expert-
        parallel ranks that hold the published copy of the experts; the others return at once.
        """
        from megatron.core import parallel_state as ps

        experts = gather_experts_hf(self.module, self.arch, grads)
        if ps.get_data_parallel_rank() != 0:
            return None
        dst = ps.get_tensor_model_parallel_src_rank()
        group = ps.get_tensor_model_parallel_group()
        named = [
            (n, p.main_grad if grads else p.detach()) for n, p in self.module.named_parameters() if not is_expert(n)
        ]
        shards: dict[str, list[torch.Tensor]] = {}
        for name, t in named:
            t = t.float().contiguous()
            if self.tp == 1:
                shards[name] = [t.clone() if t.device.type == "cpu" else t]  # never hand out views of live buffers
                continue
            bufs = [torch.empty_like(t) for _ in range(self.tp)] if self.tp_rank == 0 else None
            dist.gather(t, bufs, dst=dst, group=group)
            if bufs is not None:
                shards[name] = bufs
        if self.tp_rank != 0:
            return None
        return {k: v.cpu() for k, v in megatron_to_hf(shards, self.arch).items()} | experts

    def hf_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The HF tensors, assembled one megatron tensor at a time by one rank of data-parallel group 0's tensor-
        parallel group: decoder layer i by its rank i mod T (the embedding by rank 0, the final norm and head by
        the last), so the ranks share the work and each holds at most one gathered tensor beyond its shard.
        Replicated tensors (norms) need no gather. Ranks of other data-parallel groups yield nothing but, for MoE,
        their own experts when they hold the published copy (`experts.local_experts_hf`: each expert once)."""
        from megatron.core import parallel_state as ps

        yield from local_experts_hf(self.module, self.arch)
        if ps.get_data_parallel_rank() != 0:
            return
        group = ps.get_tensor_model_parallel_group()
        for name, p in self.module.named_parameters():
            if is_expert(name):
                continue
            owner = _owner(name, self.arch.num_layers, self.tp)
            t = p.detach()
            # not `param_is_not_tensor_parallel_duplicate`: it answers differently on each rank for a replicated one
            if self.tp == 1 or not getattr(p, "tensor_model_parallel", False):
                if owner == self.tp_rank:
                    yield from hf_of(name, [t] * self.tp, self.arch).items()
                continue
            t = t.contiguous()
            bufs = [torch.empty_like(t) for _ in range(self.tp)] if owner == self.tp_rank else None
            dist.gather(t, bufs, dst=dist.get_global_rank(group, owner), group=group)
            if bufs is not None:
                yield from hf_of(name, bufs, self.arch).items()

    # ---- checkpoints ----------------------------------------------------------------------------

    def save_checkpoint(self, root: Path, step: int) -> None:
        save_sharded(
            Path(root), step, self._weights_state(), self.optimizer.state_dict(), tensor=self.tp, expert=self.ep
        )

    def load_checkpoint(self, root: Path) -> int | None:
        loaded = load_sharded(Path(root), tensor=self.tp, expert=self.ep)
        if loaded is None:
            return None
        step, model_state, optim_state = loaded
        self.module.load_state_dict(model_state, strict=False)
        self.optimizer.load_state_dict(optim_state)
        return step

    def _weights_state(self) -> dict[str, torch.Tensor]:
        return {
            k: v for k, v in self.module.state_dict().items() if torch.is_tensor(v) and not k.endswith("_extra_state")
        }


def _owner(name: str, num_layers: int, tp: int) -> int:
    """The tensor-parallel rank that assembles and publishes megatron tensor `name` (see `hf_tensors`)."""
    if name.startswith("decoder.layers."):
        return int(name.split(".")[2]) % tp
    return 0 if name.startswith("embedding.") else (num_layers % tp if tp > 1 else 0)
