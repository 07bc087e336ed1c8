"""Temporal external storage on the payload store: no payload ever reaches Temporal's 2 MiB limit.

Any payload at or over the job's threshold (256 KiB by default) is written to
the store under a content-addressed key and replaced in history by a small
claim; the SDK swaps it back on read. Client and workers must use the same
converter (`data_converter`).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence

from temporalio.api.common.v1 import Payload
from temporalio.converter import (
    ExternalStorage,
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverStoreContext,
)

from rollart.infra.store.payload import Store

__all__ = ["PAYLOAD_PREFIX", "StorePayloadDriver", "external_storage"]

PAYLOAD_PREFIX = "payloads"


class StorePayloadDriver(StorageDriver):
    """Stores each large payload once, under the hash of its bytes (retries and replays write the same key)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def name(self) -> str:
        return "rollart-store"

    def type(self) -> str:
        return "rollart-store"

    async def store(self, context: StorageDriverStoreContext, payloads: Sequence[Payload]) -> list[StorageDriverClaim]:
        return await asyncio.to_thread(self._store_all, payloads)

    async def retrieve(
        self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
    ) -> list[Payload]:
        return await asyncio.to_thread(self._retrieve_all, claims)

    def _store_all(self, payloads: Sequence[Payload]) -> list[StorageDriverClaim]:
        claims = []
        for payload in payloads:
            data = payload.SerializeToString()
            key = f"{PAYLOAD_PREFIX}/{hashlib.sha256(data).hexdigest()}"
            if not self._store.exists(key):
                self._store.put(key, data)
            claims.append(StorageDriverClaim(claim_data={"key": key, "bytes": str(len(data))}))
        return claims

    def _retrieve_all(self, claims: Sequence[StorageDriverClaim]) -> list[Payload]:
        payloads = []
        for claim in claims:
            payload = Payload()
            payload.ParseFromString(self._store.get(claim.claim_data["key"]))
            payloads.append(payload)
        return payloads


def external_storage(store: Store, threshold_bytes: int) -> ExternalStorage:
    """Temporal's external-storage config routing payloads ≥ `threshold_bytes` to `store`."""
    return ExternalStorage(drivers=[StorePayloadDriver(store)], payload_size_threshold=threshold_bytes)
