"""Packed micro-batches (`trainer.packing`): whole sequences end to end in one `[1, N]` row, no padding.

Why: an agentic batch mixes 1-turn and 30-turn trajectories, so a `[batch, longest]` block is mostly padding
that the model still runs through. Packing bins sequences by tokens (first-fit decreasing under a budget) and
the model sees one flat stream whose position ids restart at 0 for every sequence; its attention is kept
within each sequence by the backend (a block-diagonal causal mask, or flash-attention's varlen kernel reading
the boundaries `cu_seqlens`).

Only the model's input is packed. A packed `MicroBatch` keeps the padded `[S, W]` tensors of its sequences
for the loss (mask, behaviour log-probs, per-row advantages, bonus, tasks) exactly as `collate` makes them,
and the backends `unpack` the per-token log-probs and entropies back to that layout (a gather: nothing of
vocabulary size is ever padded). The loss code is untouched, so its per-row terms (`seq_mean`, the bonus per
sequence) mean what they mean on padded batches.

The first position of every packed sequence is predicted from the previous sequence's last token; `unpack`
writes 0 there, as position 0 of a padded row (it is a prompt token: never in the loss either way).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["Packed", "pack_indices", "packed_inputs"]


@dataclass(frozen=True)
class Packed:
    """The model's input of a packed micro-batch: its S sequences end to end, and where each begins."""

    input_ids: torch.Tensor  # long [1, N]
    position_ids: torch.Tensor  # long [1, N], 0 at the first token of every sequence
    cu_seqlens: torch.Tensor  # int32 [S + 1]: sequence i is tokens cu_seqlens[i] .. cu_seqlens[i + 1]
    max_seqlen: int  # the longest sequence (flash-attention's varlen kernel takes it)

    @property
    def num_sequences(self) -> int:
        return self.cu_seqlens.numel() - 1

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[1]

    def to(self, device: torch.device) -> Packed:
        """The same on `device`."""
        if self.input_ids.device == device:
            return self
        return Packed(
            self.input_ids.to(device), self.position_ids.to(device), self.cu_seqlens.to(device), self.max_seqlen
        )

    def segment_ids(self) -> torch.Tensor:
        """`[N]` long: the index of the sequence each token belongs to."""
        lengths = (self.cu_seqlens[1:] - self.cu_seqlens[:-1]).long()
        return torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths)

    def block_causal_mask(self) -> torch.Tensor:
        """`[N, N]` bool, True where query token q may attend key token k: same sequence and k ≤ q."""
        seg = self.segment_ids()
        n = seg.numel()
        causal = torch.ones(n, n, dtype=torch.bool, device=seg.device).tril()
        return causal & (seg[:, None] == seg[None, :])

    def unpack(self, values: torch.Tensor, width: int) -> torch.Tensor:
        """Per-token `[1, N]` values (log-probs, entropies) as the padded `[S, width]` rows `collate` lays the
        same sequences out in: 0 past each sequence's end and at its first position (predicted across the
        boundary). Differentiable: a gather, so the gradient flows back to the packed positions it read."""
        starts = self.cu_seqlens[:-1].long().to(values.device)
        lengths = (self.cu_seqlens[1:] - self.cu_seqlens[:-1]).long().to(values.device)
        j = torch.arange(width, device=values.device)
        valid = (j[None, :] < lengths[:, None]) & (j[None, :] > 0)
        index = (starts[:, None] + j[None, :]).clamp(max=values.shape[-1] - 1)
        return torch.where(valid, values[0][index], values.new_zeros(()))


def pack_indices(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Bins of sequence indices, each of at most `max_tokens` tokens in all: first-fit decreasing (longest first,
    each into the first bin it fits, ties by index). A sequence longer than the budget is a bin of its own.

    Deterministic in the lengths alone, so every rank and every retry packs a share the same way."""
    if max_tokens < 1:
        raise ValueError(f"packing.max_tokens must be ≥ 1, got {max_tokens}")
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        n = lengths[i]
        slot = next((b for b, free in enumerate(room) if free >= n), None)
        if slot is None:
            bins.append([i])
            room.append(max_tokens - n)
        else:
            bins[slot].append(i)
            room[slot] -= n
    return bins


def packed_inputs(sequences: Sequence[Sequence[int]]) -> Packed:
    """The packed model input of `sequences` (token ids), in their order."""
    if not sequences or any(not s for s in sequences):
        raise ValueError("packing needs at least one sequence and no empty one")
    lengths = [len(s) for s in sequences]
    ids = torch.tensor([t for s in sequences for t in s], dtype=torch.long)[None]
    positions = torch.cat([torch.arange(n, dtype=torch.long) for n in lengths])[None]
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths, dtype=torch.int32).cumsum(0)
    return Packed(ids, positions, cu, max(lengths))
