"""Published policy weights in the store: versioned keys per job, and a `latest` pointer.

The trainer publishes version v as one safetensors blob; generation workers read
`latest` and load the blob when they are behind. Version 0 is the job's initial
model directory, never published. Blobs are written pinned (a cache such as
Mooncake must not evict the weights generators are about to pull); publishing
v removes versions ≤ v − keep. A reader that finds its version removed under it
(it was `keep` versions behind) reads `latest` again: every worker moves on to
the newest version, none ever needs an old one. Checkpoints stay on disk.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pydantic import BaseModel

from rollart.infra.store.payload import Store, StoreError, StoreKeyError, key_word

__all__ = ["PublishedWeights", "fetch_latest", "latest_key", "latest_weights", "publish", "weights_key"]

log = logging.getLogger(__name__)

_SWEEP = 8


class PublishedWeights(BaseModel):
    """What `latest` points at."""

    version: int
    key: str


def weights_key(job_id: str, version: int) -> str:
    """Key of version `version`'s safetensors blob."""
    return f"weights/{key_word(job_id)}/v{version:06d}.safetensors"


def latest_key(job_id: str) -> str:
    """Key of the job's `latest` pointer."""
    return f"weights/{key_word(job_id)}/latest"


def publish(store: Store, job_id: str, version: int, blob: bytes | memoryview, keep: int = 2) -> PublishedWeights:
    """Write the blob (pinned), then move `latest` to it, then drop versions ≤ `version − keep`.

    Readers never see a pointer to a missing blob. A removal that fails (a
    reader read it in the last seconds: Mooncake leases an object for `mooncake.lease_s`
    after each read) is retried at the next publishes: the `_SWEEP` versions
    before the kept ones are tried each time (one cheap call each).
    """
    ref = PublishedWeights(version=version, key=weights_key(job_id, version))
    store.put(ref.key, blob, pinned=True)
    store.put(latest_key(job_id), ref.model_dump_json().encode(), pinned=True)
    for old in range(version - keep, max(0, version - keep - _SWEEP), -1):
        try:
            store.delete(weights_key(job_id, old))
        except StoreError as e:
            log.debug("weights v%d of %s not removed yet: %s", old, job_id, e)
    return ref


def fetch_latest(store: Store, job_id: str, path: Path, attempts: int = 3) -> PublishedWeights | None:
    """Write the job's newest published blob to `path`; None before the first publish.

    If the blob `latest` named is removed before it is read (a newer version was
    published meanwhile), `latest` is read again.
    """
    for attempt in range(attempts):
        ref = latest_weights(store, job_id)
        if ref is None:
            return None
        try:
            store.read_to_file(ref.key, path)
            return ref
        except StoreKeyError:
            if attempt == attempts - 1:
                raise
            log.info("weights %s were replaced while being read; reading latest again", ref.key)
    return None


def latest_weights(store: Store, job_id: str) -> PublishedWeights | None:
    """The newest published version of a job, or None before the first train step."""
    try:
        return PublishedWeights.model_validate_json(store.get(latest_key(job_id)))
    except StoreKeyError:
        return None
