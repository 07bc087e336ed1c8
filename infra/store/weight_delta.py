"""Delta publishes (`weights.delta: true`): send only what changed since the version an engine holds.

In bf16 most elements of a policy do not change from one RL step to the next (an update below half a unit in
the last place rounds away), so a version can travel as the positions and values of its changed elements.
Both ends keep the last version in the publish dtype: the trainer to find what changed (`DeltaBase`), the
engine to rebuild whole tensors from a delta (`DeltaMirror`). A delta is only for an engine holding exactly
its base version; any other takes the full version, which is always published too.

Why the engine rebuilds whole *groups*: vLLM fuses some checkpoint tensors into one layer (q/k/v into
`qkv_proj`, gate/up into `gate_up_proj`) and, reloading in place, processes a layer only from everything
that belongs to it; a layer given part of its tensors would be rebuilt with the rest missing. A changed
tensor therefore brings every tensor of its module (`model.layers.3.self_attn`, ...) along.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from rollart.infra.store.payload import Store
from rollart.infra.store.weight_stream import WeightsTransferError, iter_manifest
from rollart.infra.store.weights import WeightsManifest

__all__ = ["Change", "DeltaBase", "DeltaMirror", "engine_stream", "group_of"]

_INT = {2: torch.int16, 4: torch.int32, 8: torch.int64}
_INDEX_BYTES = 8


def group_of(name: str) -> str:
    """The module a checkpoint tensor belongs to, as far as fused layers go: its name without the last two parts
    (`model.layers.3.self_attn.q_proj.weight` → `model.layers.3.self_attn`)."""
    parts = name.split(".")
    return ".".join(parts[:-2]) if len(parts) > 2 else parts[0]


Change = tuple[str, Any]
"""What a delta says of one tensor: `("same", None)`, `("sparse", (positions, values))` or `("dense", tensor)`."""


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's raw bits as integers: equal bits are equal values, NaNs and signed zeros included."""
    return t.reshape(-1).view(_INT[t.element_size()])


class DeltaBase:
    """The trainer rank's copy of what it last published (publish dtype), and what changed since."""

    def __init__(self) -> None:
        self.version: int | None = None
        self._last: dict[str, torch.Tensor] = {}

    def change(self, name: str, new: torch.Tensor) -> Change:
        """How `new` (already in the publish dtype, on the CPU) differs from the last publish of `name`; records it."""
        old = self._last.get(name)
        self._last[name] = new.clone()
        if old is None or old.shape != new.shape or old.dtype != new.dtype:
            return ("dense", new)
        changed = (_bits(old) != _bits(new)).nonzero().reshape(-1)
        if changed.numel() == 0:
            return ("same", None)
        if changed.numel() * (_INDEX_BYTES + new.element_size()) >= new.numel() * new.element_size():
            return ("dense", new)
        return ("sparse", (changed, new.reshape(-1)[changed]))

    def forget(self) -> None:
        """Drop the copy (a failed publish: the next one is full for every engine)."""
        self.version, self._last = None, {}


class DeltaMirror:
    """An engine's copy of the weights it holds (publish dtype), from which a delta rebuilds whole tensors."""

    def __init__(self) -> None:
        self.version: int | None = None
        self.job_id: str | None = None
        self._tensors: dict[str, torch.Tensor] = {}

    def holds(self, job_id: str, version: int) -> bool:
        """Whether this mirror is exactly `version` of `job_id` (a delta from it can be applied)."""
        return self.job_id == job_id and self.version == version

    def record_full(self, stream: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """Pass a full version's tensors through, keeping a copy of each."""
        self._tensors = {}
        for name, t in stream:
            self._tensors[name] = t.clone()
            yield name, self._tensors[name]

    def apply(self, stream: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, torch.Tensor]]:
        """The whole tensors a delta changes, with the rest of their groups, updated in the mirror as they pass.

        Consumes the delta (one bucket at a time), then yields group by group; unchanged groups are left out.
        """
        touched: dict[str, None] = {}
        for name, change in stream:
            if name not in self._tensors:
                raise KeyError(f"a delta names {name!r}, which this engine's weights do not hold")
            target = self._tensors[name]
            if isinstance(change, tuple):
                positions, values = change
                target.view(-1)[positions] = values.to(target.dtype)
            else:
                target.copy_(change.reshape(target.shape))
            touched[group_of(name)] = None
        for name, t in self._tensors.items():
            if group_of(name) in touched:
                yield name, t

    def mark(self, job_id: str, version: int) -> None:
        """The mirror now holds `version` of `job_id` (after a load that finished), if it keeps a copy at all."""
        if self._tensors:
            self.job_id, self.version = job_id, version

    def drop(self) -> None:
        """Forget the mirror (a failed load: it no longer matches the engine)."""
        self.job_id, self.version, self._tensors = None, None, {}


def engine_stream(store: Store, manifest: WeightsManifest, mirror: DeltaMirror) -> Iterator[tuple[str, torch.Tensor]]:
    """The whole tensors an engine loads for `manifest`: a full version as it comes (kept in the mirror when the job
    publishes deltas), a delta rebuilt against the mirror. (Engines call `check_present` before they start.)"""
    stream = iter_manifest(store, manifest)
    if manifest.kind == "delta":
        if manifest.base_version is None or not mirror.holds(manifest.job_id, manifest.base_version):
            raise WeightsTransferError(
                f"{manifest.describe()} needs this engine to hold v{manifest.base_version}, but it holds "
                f"v{mirror.version} of job {mirror.job_id!r}: load the full version"
            )
        return mirror.apply(stream)
    if manifest.deltas:
        return mirror.record_full(stream)
    mirror.drop()
    return stream
