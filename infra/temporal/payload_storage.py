"""Temporal external storage on the payload store: no payload ever reaches Temporal's 2 MiB limit, and a task's spec
is in the store once, not in every history that starts a unit of it.

Any payload at or over the job's threshold (256 KiB by default) is written to
the store under a content-addressed key and replaced in history by a small
claim; the SDK swaps it back on read. So is every payload whose type says so by a
`claim_over_bytes` class attribute, once it reaches that size: a `TaskSpec` (a
rollout unit's second argument, `contracts/rollouts.py`) whatever its size, as the
training workflow starts hundreds of units of one task and each would otherwise
copy it into the parent's history; a train step's input (its samples) and the
training workflow's input (the state it carries across continue-as-new) from
8 KiB (`contracts.activities.BULK_CLAIM_BYTES`), written once a step or a run, each ~0.4 KB a trajectory of the
parent's history at a batch of 512 (issue 48). Claims are written
pinned (a store that evicts, Mooncake, never drops one) under their owner: the
training job, or the workflow they were stored for. `rollart store gc`
(client/claims.py) removes an owner's claims once Temporal holds none of its
workflows (its histories are gone with the namespace's retention). Client and
workers must use the same converter (`data_converter`).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
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

from rollart.infra.store.keys import key_word
from rollart.infra.store.payload import Store

__all__ = [
    "CLAIM_METADATA",
    "OWNER_FILE",
    "PAYLOAD_PREFIX",
    "UNOWNED",
    "ClaimingPayloadConverter",
    "StorePayloadDriver",
    "claim_owner",
    "external_storage",
    "owner_prefix",
]

PAYLOAD_PREFIX = "payloads"

OWNER_FILE = "owner"
"""Beside an owner's claims, its id as written (`rollart store gc` asks Temporal whether its workflows remain)."""

UNOWNED = "_"
"""The owner of a claim stored with no workflow to name (never collected)."""

_UNIT_OF_JOB = re.compile(r"(?P<job>.+)-g\d{6}(?:-\d+|-b|-w)")  # a training job's unit: contracts/ids.py


def claim_owner(context: StorageDriverStoreContext) -> str:
    """Whose histories a claim serves: the training job a unit belongs to (`<job>-gNNNNNN-…`), else the workflow
    itself (a training workflow's id is its job's); `UNOWNED` when the SDK names none."""
    if context.target is None:
        return UNOWNED
    unit = _UNIT_OF_JOB.fullmatch(context.target.id)
    return unit.group("job") if unit else context.target.id


def owner_prefix(owner: str) -> str:
    """The store prefix of an owner's claims: its id as a key word, made unique if that changed it."""
    word = key_word(owner)
    return f"{PAYLOAD_PREFIX}/{word if word == owner else f'{word}-{hashlib.sha256(owner.encode()).hexdigest()[:8]}'}"


CLAIM_METADATA = "rollart-claim"
"""Payload metadata marking a payload for the store whatever the store's threshold (its value: the type's name)."""


class ClaimingPayloadConverter(PydanticPayloadConverter):
    """The pydantic converter, marking for the store (`CLAIM_METADATA`) each payload whose type has a
    `claim_over_bytes` class attribute and is at least that large."""

    def to_payloads(self, values: Sequence[object]) -> list[Payload]:
        payloads = super().to_payloads(values)
        for value, payload in zip(values, payloads):
            over = getattr(type(value), "claim_over_bytes", None)
            if over is not None and payload.ByteSize() >= over:
                payload.metadata[CLAIM_METADATA] = type(value).__name__.encode()
        return payloads


class StorePayloadDriver(StorageDriver):
    """Stores each large payload once, under the hash of its bytes (retries and replays write the same key).

    The bytes hashed are the payload's deterministic serialization: its metadata is a map, which protobuf writes in
    any order (upb's follows a hash seeded per process), so one task's spec would otherwise be stored under a key of
    each worker process and units of one task started with different claims."""

    def __init__(self, store: Store) -> None:
        self.backend = store
        self._owners: set[str] = set()  # owners whose OWNER_FILE this process has seen written

    def name(self) -> str:
        return "rollart-store"

    def type(self) -> str:
        return "rollart-store"

    async def store(self, context: StorageDriverStoreContext, payloads: Sequence[Payload]) -> list[StorageDriverClaim]:
        return await asyncio.to_thread(self._store_all, claim_owner(context), payloads)

    async def retrieve(
        self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
    ) -> list[Payload]:
        return await asyncio.to_thread(self._retrieve_all, claims)

    def _store_all(self, owner: str, payloads: Sequence[Payload]) -> list[StorageDriverClaim]:
        prefix = owner_prefix(owner)
        if owner not in self._owners:
            if not self.backend.exists(f"{prefix}/{OWNER_FILE}"):
                self.backend.put(f"{prefix}/{OWNER_FILE}", owner.encode(), pinned=True)
            self._owners.add(owner)
        claims = []
        for payload in payloads:
            data = payload.SerializeToString(deterministic=True)  # map entries sorted: one key per content
            key = f"{prefix}/{hashlib.sha256(data).hexdigest()}"
            if not self.backend.exists(key):
                self.backend.put(key, data, pinned=True)  # a cache must not evict what a history refers to
            claims.append(StorageDriverClaim(claim_data={"key": key, "bytes": str(len(data))}))
        return claims

    def _retrieve_all(self, claims: Sequence[StorageDriverClaim]) -> list[Payload]:
        payloads = []
        for claim in claims:
            payload = Payload()
            payload.ParseFromString(self.backend.get(claim.claim_data["key"]))
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
