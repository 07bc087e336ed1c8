"""Published policy weights in the store: each version a manifest and its buckets, and a `latest` pointer per job.

A version is a set of *buckets* (raw tensor bytes, at most `weights.bucket_mib` each, written by whichever
trainer rank assembled those tensors) and a *manifest* that lists every bucket and, per tensor, its name,
dtype, shape and byte range. Readers take tensors straight out of a bucket's bytes with no parsing and no
copy, and a bucket is the unit of transfer and of timeouts. Version 0 is the job's initial model directory,
never published. Everything is written pinned (a cache such as Mooncake must not evict weights generators
are about to pull); publishing v removes versions ≤ v − keep. A reader that finds its version removed under
it (it was `keep` versions behind) reads `latest` again: every worker moves on to the newest version, none
ever needs an old one. Checkpoints stay on disk.

This module is torch-free (keys, manifests, the pointer); `weight_stream` moves the tensors.
"""

from __future__ import annotations

import logging
from typing import Literal

from pydantic import BaseModel, Field

from rollart.infra.store.keys import key_word
from rollart.infra.store.payload import Store, StoreError, StoreKeyError
from rollart.spec.config.store import StoreConfig

__all__ = [
    "BucketRef",
    "PublishedWeights",
    "TensorRef",
    "WeightsManifest",
    "WeightsSource",
    "bucket_key",
    "commit",
    "latest_key",
    "latest_weights",
    "manifest_key",
    "read_manifest",
    "retire",
]

log = logging.getLogger(__name__)

_SWEEP = 8


class TensorRef(BaseModel):
    """One tensor of a bucket: bytes [offset, offset + nbytes) hold it, row-major.

    `encoding: sparse` (delta publishes) stores the flat positions of its changed elements (int64) followed
    by their new values (`dtype`), `count` of each; `dense` the whole tensor.
    """

    name: str
    dtype: str
    shape: list[int]
    offset: int
    nbytes: int
    encoding: Literal["dense", "sparse"] = "dense"
    count: int = 0


class BucketRef(BaseModel):
    """One store object of a version and the tensors in it, in the order they were written."""

    key: str
    nbytes: int
    rank: int = 0
    tensors: list[TensorRef]


class WeightsManifest(BaseModel):
    """Everything a reader needs to stream version `version` of a job: where each tensor is, and who wrote it.

    `kind: delta` holds only what changed since `base_version` (see `WeightsConfig.delta`); a full manifest
    names its delta, when one was published, so an engine holding `version - 1` can take the smaller one.
    """

    job_id: str
    version: int
    dtype: str
    kind: Literal["full", "delta"] = "full"
    base_version: int | None = None
    buckets: list[BucketRef]
    publisher: str = Field("", description="who wrote the buckets: host, process and ranks (named in errors)")
    timeout_s: float = 120.0
    deltas: bool = Field(False, description="the job publishes deltas: an engine keeps a copy to apply the next")
    delta_key: str | None = Field(None, description="this version's delta from the one before, if published")

    @property
    def nbytes(self) -> int:
        """Bytes of all buckets: what one engine pulls."""
        return sum(b.nbytes for b in self.buckets)

    @property
    def tensors(self) -> list[TensorRef]:
        """Every tensor, in bucket order."""
        return [t for b in self.buckets for t in b.tensors]

    def describe(self) -> str:
        """`weights v12 (delta from v11) of job j, 3 buckets, 1.2 GB, from <publisher>`, for logs and errors."""
        what = f"weights v{self.version}" + (f" (delta from v{self.base_version})" if self.kind == "delta" else "")
        return (
            f"{what} of job {self.job_id!r}, {len(self.buckets)} bucket(s), {self.nbytes / 1e6:.1f} MB, "
            f"published by {self.publisher or 'an unnamed trainer'}"
        )


class WeightsSource(BaseModel):
    """Where an engine streams a version from: its manifest, and the store holding the buckets (as a config, so
    that an engine's own worker process can open it)."""

    store: StoreConfig
    manifest: WeightsManifest


class PublishedWeights(BaseModel):
    """What `latest` points at: a version and its manifest's key."""

    version: int
    key: str


def _version_prefix(job_id: str, version: int) -> str:
    return f"weights/{key_word(job_id)}/v{version:06d}"


def manifest_key(job_id: str, version: int, *, delta: bool = False) -> str:
    """Key of version `version`'s manifest (or of its delta's)."""
    return f"{_version_prefix(job_id, version)}/{'delta-' if delta else ''}manifest.json"


def bucket_key(job_id: str, version: int, rank: int, index: int, *, delta: bool = False) -> str:
    """Key of bucket `index` written by trainer rank `rank` for version `version` (or its delta)."""
    return f"{_version_prefix(job_id, version)}/{'delta-' if delta else ''}r{rank:04d}-b{index:05d}.bin"


def latest_key(job_id: str) -> str:
    """Key of the job's `latest` pointer."""
    return f"weights/{key_word(job_id)}/latest"


def commit(
    store: Store, manifest: WeightsManifest, keep: int = 2, delta: WeightsManifest | None = None
) -> PublishedWeights:
    """Make a version whose buckets are written visible: its manifest (and its delta's), then `latest`; then
    retire versions ≤ `version − keep`. Readers never see a pointer to a missing manifest or bucket."""
    job_id, version = manifest.job_id, manifest.version
    if delta is not None:
        store.put(manifest_key(job_id, version, delta=True), delta.model_dump_json().encode(), pinned=True)
        manifest = manifest.model_copy(update={"delta_key": manifest_key(job_id, version, delta=True)})
    ref = PublishedWeights(version=version, key=manifest_key(job_id, version))
    store.put(ref.key, manifest.model_dump_json().encode(), pinned=True)
    store.put(latest_key(job_id), ref.model_dump_json().encode(), pinned=True)
    for old in range(version - keep, max(0, version - keep - _SWEEP), -1):
        retire(store, job_id, old)
    return ref


def retire(store: Store, job_id: str, version: int) -> None:
    """Remove a version's buckets, then its manifests. A bucket a reader may still be streaming is protected by its
    lease (Mooncake's `mooncake.lease_s` after each read): its removal fails and leaves the manifest in place, so
    the next publishes try again. A manifest goes by force once its buckets are gone (reading it here leased it):
    a reader that finds a version gone reads `latest` again."""
    for delta in (True, False):
        key = manifest_key(job_id, version, delta=delta)
        try:
            manifest = read_manifest(store, key)
        except StoreKeyError:
            continue
        except (StoreError, ValueError) as e:
            log.debug("weights v%d of %s: manifest %s unreadable: %s", version, job_id, key, e)
            continue
        try:
            for bucket in manifest.buckets:
                store.delete(bucket.key)
            store.delete(key, force=True)
        except StoreError as e:
            log.debug("weights v%d of %s not removed yet: %s", version, job_id, e)


def read_manifest(store: Store, key: str) -> WeightsManifest:
    """The manifest at `key`; StoreKeyError when that version is gone."""
    return WeightsManifest.model_validate_json(store.get(key))


def latest_weights(store: Store, job_id: str) -> PublishedWeights | None:
    """The newest published version of a job, or None before the first train step."""
    try:
        return PublishedWeights.model_validate_json(store.get(latest_key(job_id)))
    except StoreKeyError:
        return None
