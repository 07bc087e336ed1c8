"""Published policy weights in the store: versioned keys per job, and a `latest` pointer.

The trainer publishes version v as one safetensors blob; generation workers read
`latest` and load the blob when they are behind. Version 0 is the job's initial
model directory, never published.
"""

from __future__ import annotations

from pydantic import BaseModel
from rollart.infra.store import Store, StoreKeyError, key_word

__all__ = ["PublishedWeights", "latest_key", "latest_weights", "publish", "weights_key"]


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


def publish(store: Store, job_id: str, version: int, blob: bytes) -> PublishedWeights:
    """Write the blob, then move `latest` to it (readers never see a pointer to a missing blob)."""
    ref = PublishedWeights(version=version, key=weights_key(job_id, version))
    store.put(ref.key, blob)
    store.put(latest_key(job_id), ref.model_dump_json().encode())
    return ref


def latest_weights(store: Store, job_id: str) -> PublishedWeights | None:
    """The newest published version of a job, or None before the first train step."""
    try:
        return PublishedWeights.model_validate_json(store.get(latest_key(job_id)))
    except StoreKeyError:
        return None
