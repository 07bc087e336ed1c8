"""Publishing plain tensors as a policy version with the trainer's own code, for store and engine tests."""

from __future__ import annotations

import torch

from rollart.activities.training.publish import Publisher, publish_version
from rollart.activities.training.ranks import OneProcess
from rollart.infra.store.payload import Store
from rollart.infra.store.weight_stream import read_all
from rollart.infra.store.weights import PublishedWeights, latest_weights, read_manifest
from rollart.spec.config import WeightsConfig


def publish_tensors(
    store: Store,
    job: str,
    version: int,
    tensors: dict[str, torch.Tensor],
    *,
    keep: int = 2,
    bucket_mib: int = 8,
    timeout_s: float = 30.0,
) -> PublishedWeights:
    """`tensors` as `version` of `job`, float32, in buckets of at most `bucket_mib` (what a train step does)."""
    cfg = WeightsConfig(dtype="float32", bucket_mib=bucket_mib, timeout_s=timeout_s)
    ref = publish_version(tensors.items(), OneProcess(), store, job, version, cfg, keep, Publisher())
    if ref is None:
        raise RuntimeError("one process is its own leader: a publish returns the version's pointer")
    return ref


def latest_tensors(store: Store, job: str) -> dict[str, torch.Tensor]:
    """Every tensor of the job's newest published version."""
    ref = latest_weights(store, job)
    if ref is None:
        raise AssertionError(f"job {job!r} has published nothing in {store!r}")
    return read_all(store, read_manifest(store, ref.key))
