"""The payload store: where bulk data (token ids, logprobs, large payloads, weights) lives, named by key.

Workflows carry keys, never the data. `LocalStore` is a directory shared by
every worker on the machine (or a shared filesystem); `MooncakeStore`
(infra/store/mooncake.py) implements the same interface on Mooncake Store, and
`MirroredStore` puts a durable local copy behind it (the `fallback: local`
policy). `open_store` builds what a job's `store:` section asks for.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import shutil
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from rollart.infra.store.keys import check_key, key_word
from rollart.spec.config import StoreConfig

__all__ = [
    "LocalStore",
    "MirroredStore",
    "Store",
    "StoreError",
    "StoreKeyError",
    "StoreUnavailable",
    "check_key",
    "key_word",
    "open_store",
    "open_store_to_read",
]

log = logging.getLogger(__name__)


class StoreError(RuntimeError):
    """The store could not be used (unreachable, full, corrupt)."""


class StoreKeyError(StoreError, KeyError):
    """A key that is not in the store: never an empty read."""

    def __str__(self) -> str:  # KeyError's str() adds quotes around the message
        return str(self.args[0]) if self.args else "missing key"


class StoreUnavailable(StoreError):
    """The store's service cannot be reached (e.g. the Mooncake master is down): nothing can be said of the key."""


class Store(ABC):
    """Key → bytes. Keys are slash-separated words; writes are atomic; a missing key raises."""

    _config: StoreConfig | None = None

    @property
    def config(self) -> StoreConfig:
        """The config that opens this store again in another process (`open_store`): an engine's own worker."""
        if self._config is None:
            raise StoreError(f"{self!r} was not opened from a config; open it with open_store(StoreConfig(...))")
        return self._config

    @abstractmethod
    def put(self, key: str, data: bytes | bytearray | memoryview, *, pinned: bool = False) -> None:
        """Write (or overwrite) `key`; readers never see a partial value.

        `pinned`: a cache must not evict it (published weights); it stays until deleted.
        """

    @abstractmethod
    def get(self, key: str) -> bytes:
        """The value of `key`, or StoreKeyError naming it."""

    @abstractmethod
    def delete(self, key: str, *, force: bool = False) -> None:
        """Remove `key` if present. A cache may refuse while a reader holds the key (Mooncake leases an object for
        `mooncake.lease_s` after each read) unless `force`: only for what no read in flight needs."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether `key` is present."""

    def read_to_file(self, key: str, path: Path) -> int:
        """Write the value of `key` to the file `path` (for weights an engine loads from disk); returns its size."""
        data = self.get(key)
        Path(path).write_bytes(data)
        return len(data)

    def read_buffer(self, key: str) -> Any:
        """The value of `key` as a buffer (buffer protocol) that tensors can view in place without a copy.

        A local file is mapped copy-on-write instead of read (nothing is copied until written); other stores
        read it into memory.
        """
        return self.get(key)

    def close(self) -> None:  # noqa: B027 (optional to override: most stores hold no connection)
        """Release connections; the default holds none."""

    def put_json(self, key: str, obj: Any) -> None:
        """Store a JSON-serialisable object (compact encoding)."""
        self.put(key, json.dumps(obj, separators=(",", ":")).encode())

    def get_json(self, key: str) -> Any:
        """Read back what `put_json` stored."""
        return json.loads(self.get(key))


class LocalStore(Store):
    """A directory: one file per key, written via a temp file and rename."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        self._config = StoreConfig(kind="local", path=self.root)

    def put(self, key: str, data: bytes | bytearray | memoryview, *, pinned: bool = False) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise StoreKeyError(f"key {key!r} is not in the local store at {self.root}") from None

    def read_to_file(self, key: str, path: Path) -> int:
        try:
            shutil.copyfile(self._path(key), path)
        except FileNotFoundError:
            raise StoreKeyError(f"key {key!r} is not in the local store at {self.root}") from None
        return Path(path).stat().st_size

    def read_buffer(self, key: str) -> Any:
        try:
            with self._path(key).open("rb") as f:
                if os.fstat(f.fileno()).st_size == 0:
                    return bytearray()
                return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        except FileNotFoundError:
            raise StoreKeyError(f"key {key!r} is not in the local store at {self.root}") from None

    def delete(self, key: str, *, force: bool = False) -> None:
        self._path(key).unlink(missing_ok=True)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"


class MirroredStore(Store):
    """Mooncake as a cache in front of a durable local store: the `fallback: local` policy.

    Writes go to both (local first, so an acknowledged write survives the
    master); reads try the cache, then the local copy. Why both: Mooncake keeps
    objects in memory that other processes lend, and its master holds the only
    index; when it dies every key it knew is gone, and a trajectory whose turn
    records were only there would be lost. When the cache is unreachable it is
    skipped for `retry_after_s` (not paid as a timeout per call), then tried again.
    """

    def __init__(self, cache: Store, backing: Store, retry_after_s: float = 10.0) -> None:
        self.cache = cache
        self.backing = backing
        self.retry_after_s = retry_after_s
        self._down_until = 0.0
        self._lock = threading.Lock()

    def put(self, key: str, data: bytes | bytearray | memoryview, *, pinned: bool = False) -> None:
        self.backing.put(key, data, pinned=pinned)
        self._try_cache(lambda: self.cache.put(key, data, pinned=pinned), key)

    def get(self, key: str) -> bytes:
        if self._cache_up():
            try:
                return self.cache.get(key)
            except StoreKeyError:
                pass
            except StoreError as e:
                self._mark_down(e)
        try:
            return self.backing.get(key)
        except StoreKeyError:
            raise StoreKeyError(
                f"key {key!r} is neither in {self.cache!r} nor in {self.backing!r}: it was never written "
                "(or was deleted); check the producer's logs"
            ) from None

    def read_to_file(self, key: str, path: Path) -> int:
        if self._cache_up():
            try:
                return self.cache.read_to_file(key, path)
            except StoreKeyError:
                pass
            except StoreError as e:
                self._mark_down(e)
        return self.backing.read_to_file(key, path)

    def delete(self, key: str, *, force: bool = False) -> None:
        # A cache that refuses (a reader's lease) fails the delete before the local copy goes: the caller tries
        # again later, and no pinned copy is left in the cache that nothing would ever remove.
        if self._cache_up():
            try:
                self.cache.delete(key, force=force)
            except StoreUnavailable as e:
                self._mark_down(e)
        self.backing.delete(key, force=force)

    def exists(self, key: str) -> bool:
        return self.backing.exists(key)  # every acknowledged write is there

    def close(self) -> None:
        self.cache.close()
        self.backing.close()

    def _cache_up(self) -> bool:
        return time.monotonic() >= self._down_until

    def _mark_down(self, e: StoreError) -> None:
        with self._lock:
            if self._cache_up():
                log.warning("store: %s; using the local store for %gs before trying again", e, self.retry_after_s)
            self._down_until = time.monotonic() + self.retry_after_s

    def _try_cache(self, op: Any, key: str) -> None:
        if not self._cache_up():
            return
        try:
            op()
        except StoreUnavailable as e:
            self._mark_down(e)
        except StoreError as e:  # e.g. the cache is full: the local copy serves this key
            log.warning("store: %s; %r stays only in the local store", e, key)

    def __repr__(self) -> str:
        return f"MirroredStore(cache={self.cache!r}, backing={self.backing!r})"


_OPEN: dict[StoreConfig, Store] = {}
_OPEN_LOCK = threading.Lock()


def open_store(cfg: StoreConfig) -> Store:
    """The store a job's config names. One Mooncake client per process and config (it owns listeners and threads)."""
    if cfg.kind == "local":
        return LocalStore(cfg.path)
    if cfg.kind != "mooncake":
        raise ValueError(f"unknown store kind {cfg.kind!r}")
    with _OPEN_LOCK:
        store = _OPEN.get(cfg)
        if store is None:
            from rollart.infra.store.mooncake import MooncakeStore

            store = MooncakeStore.connect(cfg.mooncake)
            if cfg.fallback == "local":
                store = MirroredStore(store, LocalStore(cfg.path), retry_after_s=cfg.mooncake.retry_after_s)
            store._config = cfg
            _OPEN[cfg] = store
        return store


def open_store_to_read(cfg: StoreConfig) -> Store:
    """`open_store`, or while the Mooncake master cannot be reached and the job has `fallback: local`, the local
    copy (which holds everything a mirrored store wrote): for a process that only reads what was published (an
    engine streaming weights in), whose first use may come while the master is down. Nothing is kept, so the
    next call tries Mooncake again."""
    try:
        return open_store(cfg)
    except StoreUnavailable as e:
        if cfg.kind != "mooncake" or cfg.fallback != "local":
            raise
        log.warning("store: %s; reading the local fallback %s until it is back", e, cfg.path)
        return LocalStore(cfg.path)
