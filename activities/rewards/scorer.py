"""A small learned transcript scorer (torch): a byte-level transformer encoder with a scalar head.

Built locally and deterministically from a seed (no hub), or loaded from a state-dict file.
Its cost per transcript is real compute: `layers` encoder layers of width `hidden` over up
to `max_len` bytes, `passes` times. Imported only by workers that load a reward model.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

__all__ = ["TranscriptScorer"]

_VOCAB = 257  # bytes + padding
_PAD = 256


class TranscriptScorer(nn.Module):
    """bytes → embeddings (+ positions) → transformer encoder → mean pool → linear → sigmoid score in (0, 1)."""

    def __init__(self, hidden: int, layers: int, heads: int, max_len: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.embed = nn.Embedding(_VOCAB, hidden, padding_idx=_PAD)
        self.pos = nn.Embedding(max_len, hidden)
        layer = nn.TransformerEncoderLayer(hidden, heads, dim_feedforward=4 * hidden, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(hidden, 1)

    @classmethod
    def build(
        cls, *, hidden: int, layers: int, heads: int, max_len: int, seed: int, checkpoint: Path | None = None
    ) -> TranscriptScorer:
        """Same arguments, same weights: random init from `seed`, or the state dict in `checkpoint`."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = cls(hidden, layers, heads, max_len)
        if checkpoint is not None:
            model.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=True))
        return model.eval()

    def encode(self, texts: list[str]) -> torch.Tensor:
        """The last `max_len` bytes of each text, right-padded: (batch, length) token ids."""
        rows = [list(t.encode("utf-8", errors="replace")[-self.max_len :]) or [_PAD] for t in texts]
        width = max(len(r) for r in rows)
        return torch.tensor([r + [_PAD] * (width - len(r)) for r in rows], dtype=torch.long)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pad = ids == _PAD
        x = self.embed(ids) + self.pos(torch.arange(ids.shape[1]))
        x = self.encoder(x, src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).float()
        pooled = (x * keep).sum(1) / keep.sum(1).clamp(min=1.0)
        return torch.sigmoid(self.head(pooled)).squeeze(-1)

    @torch.inference_mode()
    def score(self, texts: list[str], passes: int = 1) -> list[float]:
        """One score per text; `passes` > 1 repeats the forward (a knob for how much compute a call costs)."""
        ids = self.encode(texts)
        out = self(ids)
        for _ in range(passes - 1):
            out = self(ids)
        return [float(v) for v in out]
