"""Temporal external storage on the payload store: no payload ever reaches Temporal's 2 MiB limit, and a task's spec
is in the store once, not in every history that starts a unit of it.

Any payload at or over the job's threshold (256 KiB by default) is written to
the store under a content-addressed key and replaced in history by a small
claim; the SDK swaps it back on read. So is every payload that is a `TaskSpec`
of its own (a rollout unit's second argument, `contracts/rollouts.py`), whatever
its size: the training workflow starts hundreds of units of one task, and each
would otherwise copy it into the parent's history (issue 48). Claims are written
pinned: a store that evicts (Mooncake) never drops one. Client and workers must
use the same converter (`data_converter`).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence

from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.converter import (
    ExternalStorage,
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverSelectContext,
    StorageDriverStoreContext,
)

from rollart.infra.store.payload import Store
from rollart.spec.config import TaskSpec

__all__ = ["CLAIM_METADATA", "PAYLOAD_PREFIX", "ClaimingPayloadConverter", "StorePayloadDriver", "external_storage"]

PAYLOAD_PREFIX = "payloads"

CLAIM_METADATA = "rollart-claim"
"""Payload metadata marking a payload for the store whatever its size (its value names what it holds)."""


class ClaimingPayloadConverter(PydanticPayloadConverter):
    """The pydantic converter, marking each `TaskSpec` payload for the store (`CLAIM_METADATA`)."""

    def to_payloads(self, values: Sequence[object]) -> list[Payload]:
        payloads = super().to_payloads(values)
        for value, payload in zip(values, payloads):
            if isinstance(value, TaskSpec):
                payload.metadata[CLAIM_METADATA] = b"task"
        return payloads


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
                self._store.put(key, data, pinned=True)  # a cache must not evict what a history refers to
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
    """Temporal's external-storage config routing payloads ≥ `threshold_bytes`, and those marked
    `CLAIM_METADATA` (a task's spec), to `store`."""
    driver = StorePayloadDriver(store)

    def select(context: StorageDriverSelectContext, payload: Payload) -> StorageDriver | None:
        return driver if CLAIM_METADATA in payload.metadata or payload.ByteSize() >= threshold_bytes else None

    # threshold 0: the selector sees every payload and keeps the size rule itself
    return ExternalStorage(drivers=[driver], driver_selector=select, payload_size_threshold=0)
