"""The `Store` interface on Mooncake Store: TCP on loopback here, the same calls over RDMA on a cluster.

Mooncake's Python client reports failure through return codes, and `get`
returns `b''` both for a missing key and for an error. Every read here first
asks for the object's size, so a missing key becomes `StoreKeyError` and an
unreachable master `StoreUnavailable`, each naming the key and what to do —
never an empty read.

Objects larger than a small limit go through a registered staging buffer
with `put_from` / `get_into` (zero-copy on the wire: the transfer engine
reads and writes that memory directly) instead of the client's local buffer,
which caps the size of a plain `put`. Small values carry a one-byte prefix,
because Mooncake cannot store an empty object and an empty value is a value.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from rollart.infra.store.payload import Store, StoreError, StoreKeyError, StoreUnavailable, check_key
from rollart.spec.config import MooncakeConfig

__all__ = ["MooncakeStore", "mooncake_env"]

log = logging.getLogger(__name__)

# Mooncake's error codes (mooncake-store/include/types.h) that matter here.
_OBJECT_NOT_FOUND = -704
_OBJECT_HAS_LEASE = -706
_UNAVAILABLE = {-900, -901, -902, -903, -904, -905, -906, -907, -908, -909, -910}  # RPC_FAIL and friends
_MIB = 1 << 20
_FRAME = b"\x01"  # prefix of small values


def mooncake_env() -> dict[str, str]:
    """Environment for Mooncake clients and its binaries: quiet logs, fail fast when the master is missing."""
    return {
        "MC_LOG_LEVEL": os.environ.get("MC_LOG_LEVEL", "ERROR"),
        "MC_STORE_CLIENT_SETUP_RETRIES": os.environ.get("MC_STORE_CLIENT_SETUP_RETRIES", "1"),
        "MC_TCP_BIND_ADDRESS": os.environ.get("MC_TCP_BIND_ADDRESS", "127.0.0.1"),
    }


class MooncakeStore(Store):
    """One Mooncake Store client for this process. Thread-safe; `close()` releases it.

    Built by `connect`; a process normally holds one (see `open_store`), since
    each client starts a transfer engine with its own listeners and threads.
    """

    def __init__(self, client: Any, cfg: MooncakeConfig) -> None:
        self._client = client
        self._cfg = cfg
        self._small = cfg.buffer_mib * _MIB // 2  # below: framed plain put/get; from here: staging buffer
        self._staging: Any = None  # torch uint8 tensor registered with the client
        self._staging_lock = threading.Lock()

    @classmethod
    def connect(cls, cfg: MooncakeConfig) -> MooncakeStore:
        """Set up a client against `cfg.master`; StoreUnavailable (within ~5 s) when no master answers."""
        if not cfg.master:
            raise StoreError(
                "store.mooncake.master is not set: start the local stack (`rollart up`), which starts a master, "
                "or pass the address of a running one (`rollart worker --store-master HOST:PORT`)"
            )
        for k, v in mooncake_env().items():
            os.environ.setdefault(k, v)
        from mooncake.store import MooncakeDistributedStore

        client = MooncakeDistributedStore()
        rc = client.setup(
            cfg.host,
            "P2PHANDSHAKE",
            cfg.segment_mib * _MIB,
            cfg.buffer_mib * _MIB,
            cfg.protocol,
            cfg.rdma_devices,
            cfg.master,
        )
        if rc != 0:
            raise StoreUnavailable(
                f"cannot connect to the Mooncake master at {cfg.master} (setup returned {rc}): is it running? "
                "`rollart up` starts one; on a cluster start `mooncake_master` and pass its address"
            )
        log.info("Mooncake client up: master %s, %s, segment %d MiB", cfg.master, cfg.protocol, cfg.segment_mib)
        return cls(client, cfg)

    @property
    def master(self) -> str:
        return self._cfg.master or "?"

    # ---- Store -------------------------------------------------------------------------------

    def put(self, key: str, data: bytes | bytearray | memoryview, *, pinned: bool = False) -> None:
        check_key(key)
        view = memoryview(data).cast("B")
        config = self._replicate_config(pinned)
        if view.nbytes < self._small:  # stored size ≤ _small: framed
            rc = self._client.upsert(key, _FRAME + view.tobytes(), config)
        else:
            with self._staging_lock:
                buf = self._staging_for(view.nbytes)
                buf.numpy()[: view.nbytes] = np.frombuffer(view, dtype=np.uint8)
                rc = self._client.upsert_from(key, buf.data_ptr(), view.nbytes, config)
        if rc != 0:
            raise self._error(rc, key, "writing")

    def get(self, key: str) -> bytes:
        check_key(key)
        size = self._size(key)
        if size <= self._small:
            data = self._client.get(key)
            if len(data) != size or data[:1] != _FRAME:
                raise self._vanished(key, "reading", len(data), size)
            return data[1:]
        with self._staging_lock:
            return bytes(self._read_staged(key, size))

    def read_to_file(self, key: str, path: Path) -> int:
        """Stream `key` into a file from the staging buffer (no intermediate bytes object)."""
        check_key(key)
        size = self._size(key)
        if size <= self._small:
            data = self.get(key)
            Path(path).write_bytes(data)
            return len(data)
        with self._staging_lock:
            view = self._read_staged(key, size)
            with open(path, "wb") as f:
                f.write(view)
        return size

    def delete(self, key: str, *, force: bool = False) -> None:
        check_key(key)
        rc = self._client.remove(key, True) if force else self._client.remove(key)
        if rc in (0, _OBJECT_NOT_FOUND):
            return
        if rc == _OBJECT_HAS_LEASE:  # a reader holds it right now: leave it, the caller may try again later
            raise StoreError(f"cannot remove {key!r} from Mooncake yet: a reader holds a lease on it (try again later)")
        raise self._error(rc, key, "removing")

    def exists(self, key: str) -> bool:
        check_key(key)
        rc = self._client.is_exist(key)
        if rc < 0:
            raise self._error(rc, key, "looking up")
        return rc == 1

    def close(self) -> None:
        """Release the client (its segment, if it lent one, goes with it)."""
        self._client.close()

    # ---- helpers -----------------------------------------------------------------------------

    def _size(self, key: str) -> int:
        size = self._client.get_size(key)
        if size < 0:
            raise self._error(size, key, "reading")
        return size

    def _read_staged(self, key: str, size: int) -> memoryview:
        """`key` read with `get_into` into the staging buffer (caller holds the lock)."""
        buf = self._staging_for(size)
        n = self._client.get_into(key, buf.data_ptr(), size)
        if n < 0:
            raise self._error(n, key, "reading")
        if n != size:
            raise self._vanished(key, "reading", n, size)
        return memoryview(buf.numpy())[:size]

    def _staging_for(self, size: int) -> Any:
        """A registered buffer of at least `size` bytes, grown (and re-registered) by powers of two."""
        import torch

        if self._staging is None or self._staging.numel() < size:
            if self._staging is not None:
                self._client.unregister_buffer(self._staging.data_ptr())
            cap = 1 << max(size - 1, 1).bit_length()
            buf = torch.empty(cap, dtype=torch.uint8)
            rc = self._client.register_buffer(buf.data_ptr(), cap)
            if rc != 0:
                raise StoreError(f"Mooncake refused to register a {cap / _MIB:.0f} MiB staging buffer (code {rc})")
            self._staging = buf
        return self._staging

    def _replicate_config(self, pinned: bool) -> Any:
        from mooncake.store import ReplicateConfig

        config = ReplicateConfig()
        config.with_hard_pin = pinned  # pinned: never evicted; removed explicitly when outdated
        return config

    def _error(self, rc: int, key: str, doing: str) -> StoreError:
        if rc == _OBJECT_NOT_FOUND:
            return StoreKeyError(
                f"key {key!r} is not in Mooncake (master {self.master}): never written, evicted (the store is a "
                "cache: raise store.mooncake.keeper_segment_mib), or lost with the master or the keeper that held "
                "it; set store.fallback: local to keep a copy on disk"
            )
        if rc in _UNAVAILABLE:
            return StoreUnavailable(
                f"Mooncake master {self.master} unreachable while {doing} {key!r} (code {rc}): restart it "
                "(`rollart up` starts one) or set store.fallback: local to carry on from the local store"
            )
        return StoreError(f"Mooncake failed {doing} {key!r} (code {rc}, master {self.master})")

    def _vanished(self, key: str, doing: str, got: int, size: int) -> StoreError:
        exists = self._client.is_exist(key)
        if exists == 0:
            return self._error(_OBJECT_NOT_FOUND, key, doing)
        return StoreError(
            f"Mooncake returned {got} of {size} bytes {doing} {key!r} (master {self.master}): "
            "a partial read is never used; retry"
        )

    def __repr__(self) -> str:
        return f"MooncakeStore(master={self.master!r})"
