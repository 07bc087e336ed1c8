"""The payload store: where bulk data (token ids, logprobs, large payloads) lives, named by key.

Workflows carry keys, never the data. `LocalStore` is a directory shared by
every worker on the machine (or a shared filesystem); a Mooncake-backed store
implements the same interface.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from rollart.infra.config import StoreConfig

__all__ = ["LocalStore", "Store", "StoreError", "StoreKeyError", "key_word", "open_store"]

_KEY = re.compile(r"^[A-Za-z0-9_.=@-]+(/[A-Za-z0-9_.=@-]+)*$")


def key_word(text: str) -> str:
    """Any text (a workflow id, a job id) made safe as one word of a store key."""
    return re.sub(r"[^A-Za-z0-9_.=@-]", "_", text) or "_"


class StoreError(RuntimeError):
    """The store could not be used (unreachable, full, corrupt)."""


class StoreKeyError(StoreError, KeyError):
    """A key that is not in the store: never an empty read."""

    def __str__(self) -> str:  # KeyError's str() adds quotes around the message
        return str(self.args[0]) if self.args else "missing key"


class Store(ABC):
    """Key → bytes. Keys are slash-separated words; writes are atomic; a missing key raises."""

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Write (or overwrite) `key`; readers never see a partial value."""

    @abstractmethod
    def get(self, key: str) -> bytes:
        """The value of `key`, or StoreKeyError naming it."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove `key` if present."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether `key` is present."""

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

    def put(self, key: str, data: bytes) -> None:
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

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def _path(self, key: str) -> Path:
        if not _KEY.match(key) or any(part in (".", "..") for part in key.split("/")):
            raise ValueError(f"invalid store key {key!r}: use slash-separated words of [A-Za-z0-9_.=@-]")
        return self.root / key

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"


def open_store(cfg: StoreConfig) -> Store:
    """The store a job's config names."""
    if cfg.kind == "local":
        return LocalStore(cfg.path)
    raise ValueError(f"unknown store kind {cfg.kind!r}")
