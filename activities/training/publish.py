"""Publishing a policy version: every rank streams the HF tensors it assembles into buckets; the leader commits.

A collective of the train step. `Policy.hf_tensors()` yields, on each rank, the tensors that rank publishes
(the torch backend: all of them on its one process; megatron: each decoder layer gathered over the tensor-
parallel group to one of its ranks, in turn). Each rank casts them to the publish dtype and writes buckets of
at most `weights.bucket_mib` as it goes, so no rank ever holds more than one bucket beyond its own shard;
the leader gathers the bucket lists, writes the manifest and moves `latest` (the commit point readers see).
With `weights.delta`, each rank also writes what changed since its previous publish (`infra/store/weight_delta`).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from rollart.activities.training.ranks import Ranks
from rollart.infra.store.payload import Store
from rollart.infra.store.weight_delta import DeltaBase
from rollart.infra.store.weight_stream import DTYPES, BucketWriter
from rollart.infra.store.weights import BucketRef, PublishedWeights, WeightsManifest, commit
from rollart.spec.config.weights import WeightsConfig

__all__ = ["Publisher", "publish_version"]

log = logging.getLogger(__name__)


@dataclass
class Publisher:
    """What a rank keeps between publishes: the delta base, when deltas are on."""

    delta: DeltaBase = field(default_factory=DeltaBase)


@dataclass(frozen=True)
class _RankPart:
    who: str
    full: list[BucketRef]
    delta: list[BucketRef] | None


def _interleave(parts: list[list[BucketRef]]) -> list[BucketRef]:
    """Buckets in the order ranks wrote them, taken in turn (layers assigned in turn come out roughly in order)."""
    out: list[BucketRef] = []
    for i in range(max((len(p) for p in parts), default=0)):
        out += [p[i] for p in parts if i < len(p)]
    return out


def publish_version(
    tensors: Iterable[tuple[str, torch.Tensor]],
    ranks: Ranks,
    store: Store,
    job_id: str,
    version: int,
    cfg: WeightsConfig,
    keep: int,
    publisher: Publisher,
) -> PublishedWeights | None:
    """Publish a policy as `version` of `job_id` (a collective): `tensors` are what this rank publishes of it
    (`Policy.hf_tensors()`); the leader returns what `latest` now names, the other ranks None."""
    dtype = DTYPES[cfg.dtype]
    full = BucketWriter(store, job_id, version, cfg, rank=ranks.rank)
    base = publisher.delta if cfg.delta else None
    with_delta = base is not None and base.version == version - 1
    delta = BucketWriter(store, job_id, version, cfg, rank=ranks.rank, delta=True) if with_delta else None
    try:
        for name, tensor in tensors:
            t = tensor.detach().to("cpu", dtype).contiguous()
            full.add(name, t)
            if base is None:
                continue
            kind, what = base.change(name, t)
            if delta is None or kind == "same":
                continue
            if kind == "sparse":
                delta.add_sparse(name, list(t.shape), *what)
            else:
                delta.add(name, what)
        part = _RankPart(_who(ranks), full.finish(), delta.finish() if delta is not None else None)
    except BaseException:
        if base is not None:
            base.forget()
        raise
    if base is not None:
        base.version = version
    parts = ranks.gather(part)
    if parts is None:
        return None
    manifest = WeightsManifest(
        job_id=job_id,
        version=version,
        dtype=cfg.dtype,
        buckets=_interleave([p.full for p in parts]),
        publisher=_publisher(parts),
        timeout_s=cfg.timeout_s,
        deltas=cfg.delta,
    )
    delta_manifest = None
    if all(p.delta is not None for p in parts):
        delta_manifest = manifest.model_copy(
            update={"kind": "delta", "base_version": version - 1, "buckets": _interleave([p.delta for p in parts])}
        )
    return commit(store, manifest, keep, delta_manifest)


def _who(ranks: Ranks) -> str:
    return f"{socket.gethostname()}:{os.getpid()}" + (f" (rank {ranks.rank})" if ranks.world_size > 1 else "")


def _publisher(parts: list[_RankPart]) -> str:
    """The trainer process(es) that wrote a version's buckets, as errors name them."""
    writers = [p.who for p in parts if p.full]
    return "trainer " + ", ".join(writers[:4]) + (f" and {len(writers) - 4} more" if len(writers) > 4 else "")
