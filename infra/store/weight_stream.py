"""Weights as a stream of tensors through the store: written in buckets by trainer ranks, read bucket by bucket.

Why buckets of raw bytes and a manifest, not one safetensors blob: a writer holds at most one bucket (it
casts each tensor to the publish dtype and appends its bytes), a reader views tensors in place in the
bucket's bytes (`torch.frombuffer`, no parse and no copy; a local store's file is memory-mapped), and a
bucket is the unit that a timeout bounds. A reader fetches the next bucket on a thread while the engine
loads the current one, so transfer and load overlap; one that does not arrive within the manifest's
`timeout_s` raises `WeightsTransferError` naming the version, the bucket and its publisher.

Only trainers and engines import this module (torch); `weights` holds the torch-free manifest side.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from rollart.infra.store.payload import Store, StoreError, StoreKeyError
from rollart.infra.store.weights import BucketRef, TensorRef, WeightsManifest, bucket_key
from rollart.spec.config.weights import WeightsConfig

__all__ = [
    "DTYPES",
    "BucketWriter",
    "WeightsTransferError",
    "check_present",
    "iter_manifest",
    "read_all",
    "with_deadline",
    "write_all",
]

log = logging.getLogger(__name__)

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_INDEX = torch.int64


class WeightsTransferError(StoreError):
    """A bucket of published weights was not written or not received in time, or is gone: names what and who."""


def with_deadline(fn: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """`fn()` on a thread, or `WeightsTransferError` saying `what` did not finish within `timeout_s`.

    Why a thread: a store call to a peer that died may block in a client library that has no timeout of its
    own. The thread is abandoned on timeout (it holds no lock of ours), and the caller fails loudly instead.
    """
    box: list[Any] = []
    done = threading.Event()

    def run() -> None:
        try:
            box.append((True, fn()))
        except BaseException as e:
            box.append((False, e))
        finally:
            done.set()

    threading.Thread(target=run, daemon=True, name="rollart-weights-io").start()
    if not done.wait(timeout_s):
        raise WeightsTransferError(f"{what}: not done within {timeout_s:g} s (weights.timeout_s)")
    ok, value = box[0]
    if not ok:
        raise value
    return value


class BucketWriter:
    """Appends tensors, cast to the publish dtype, into buckets of at most `cfg.bucket_bytes`; each full bucket is
    put into the store (pinned) before the next begins, so the writer holds one bucket at a time."""

    def __init__(
        self, store: Store, job_id: str, version: int, cfg: WeightsConfig, *, rank: int = 0, delta: bool = False
    ) -> None:
        if cfg.dtype == "auto":
            raise ValueError("weights.dtype auto must be resolved to the engine's dtype before publishing")
        self.store, self.job_id, self.version, self.cfg = store, job_id, version, cfg
        self.rank, self.delta = rank, delta
        self.dtype = DTYPES[cfg.dtype]
        self.buckets: list[BucketRef] = []
        self._buf = bytearray()
        self._refs: list[TensorRef] = []

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Append `tensor` (any dtype or device) as `name`, in the publish dtype."""
        t = tensor.detach().to("cpu", self.dtype).contiguous()
        self._append(TensorRef(name=name, dtype=self.cfg.dtype, shape=list(t.shape), offset=0, nbytes=0), [t])

    def add_sparse(self, name: str, shape: list[int], positions: torch.Tensor, values: torch.Tensor) -> None:
        """Append the changed elements of `name` (flat positions and their new values): a delta's entry."""
        pos = positions.to("cpu", _INDEX).contiguous()
        vals = values.detach().to("cpu", self.dtype).contiguous()
        ref = TensorRef(
            name=name, dtype=self.cfg.dtype, shape=shape, offset=0, nbytes=0, encoding="sparse", count=pos.numel()
        )
        self._append(ref, [pos, vals])

    def _append(self, ref: TensorRef, parts: list[torch.Tensor]) -> None:
        size = sum(p.numel() * p.element_size() for p in parts)
        if self._buf and len(self._buf) + size > self.cfg.bucket_bytes:
            self.flush()
        offset = len(self._buf)
        for p in parts:
            if p.numel():
                self._buf += memoryview(p.reshape(-1).view(torch.uint8).numpy())
        self._refs.append(ref.model_copy(update={"offset": offset, "nbytes": size}))

    def flush(self) -> None:
        """Put the current bucket into the store, if it holds anything."""
        if not self._refs:
            return
        key = bucket_key(self.job_id, self.version, self.rank, len(self.buckets), delta=self.delta)
        data, n = self._buf, len(self._buf)
        with_deadline(
            lambda: self.store.put(key, data, pinned=True),
            self.cfg.timeout_s,
            f"writing bucket {key} ({n / 1e6:.1f} MB) of weights v{self.version} to {self.store!r}",
        )
        self.buckets.append(BucketRef(key=key, nbytes=n, rank=self.rank, tensors=self._refs))
        self._buf, self._refs = bytearray(), []

    def finish(self) -> list[BucketRef]:
        """Flush the last bucket; the buckets this writer put, in order."""
        self.flush()
        return self.buckets


def _view(buf: Any, ref: TensorRef) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The tensor `ref` inside `buf` without a copy (a sparse entry: its positions and values)."""
    dtype = DTYPES[ref.dtype]
    with warnings.catch_warnings():  # a read-only buffer (bytes) is only ever read here
        warnings.simplefilter("ignore", UserWarning)
        if ref.encoding == "sparse":
            pos = torch.frombuffer(buf, dtype=_INDEX, count=ref.count, offset=ref.offset) if ref.count else None
            at = ref.offset + ref.count * 8
            vals = torch.frombuffer(buf, dtype=dtype, count=ref.count, offset=at) if ref.count else None
            empty = torch.empty(0, dtype=_INDEX), torch.empty(0, dtype=dtype)
            return (pos, vals) if pos is not None and vals is not None else empty
        numel = 1
        for d in ref.shape:
            numel *= d
        if numel == 0:
            return torch.empty(ref.shape, dtype=dtype)
        return torch.frombuffer(buf, dtype=dtype, count=numel, offset=ref.offset).view(ref.shape)


def check_present(store: Store, manifest: WeightsManifest) -> None:
    """Raise `WeightsTransferError` unless every bucket of `manifest` is in the store, before anything is loaded:
    a version retired (or lost) under a reader is found before a live engine has half of it."""
    for b in manifest.buckets:
        present = with_deadline(
            lambda b=b: store.exists(b.key), manifest.timeout_s, f"looking up bucket {b.key} of {manifest.describe()}"
        )
        if not present:
            raise WeightsTransferError(
                f"bucket {b.key} of {manifest.describe()} is not in {store!r}: the version was retired or its "
                "publish did not finish"
            )


def iter_manifest(store: Store, manifest: WeightsManifest) -> Iterator[tuple[str, Any]]:
    """`(name, tensor)` of every dense entry, and `(name, (positions, values))` of every sparse one, in manifest
    order; the next bucket is fetched on a thread while this one is consumed (at most two are held).

    Tensors view the bucket's memory: copy one to keep it past the next bucket.
    """
    buckets = manifest.buckets
    if not buckets:
        return
    slots: queue.Queue[Any] = queue.Queue()
    room = threading.Semaphore(2)  # buckets alive at once: the one being loaded and the next
    stop = threading.Event()

    def fetch() -> None:
        for b in buckets:
            while not room.acquire(timeout=0.1):
                if stop.is_set():
                    return
            if stop.is_set():
                return
            try:
                item: Any = store.read_buffer(b.key)
            except BaseException as e:
                item = e
            slots.put(item)
            if isinstance(item, BaseException):
                return

    threading.Thread(target=fetch, daemon=True, name="rollart-weights-fetch").start()
    try:
        for i, b in enumerate(buckets):
            what = f"bucket {i + 1}/{len(buckets)} ({b.key}, {b.nbytes / 1e6:.1f} MB) of {manifest.describe()}"
            t0 = time.monotonic()
            try:
                buf = slots.get(timeout=manifest.timeout_s)
            except queue.Empty:
                raise WeightsTransferError(
                    f"{what}: not received from {store!r} within {manifest.timeout_s:g} s (weights.timeout_s); "
                    "is the store (or the Mooncake segment holding it) still up?"
                ) from None
            if isinstance(buf, StoreKeyError):
                raise WeightsTransferError(f"{what}: gone from {store!r} ({buf}); the version was retired") from buf
            if isinstance(buf, BaseException):
                raise WeightsTransferError(f"{what}: reading it from {store!r} failed: {buf}") from buf
            if len(buf) < b.nbytes:
                raise WeightsTransferError(f"{what}: {len(buf)} bytes in {store!r}, the manifest says {b.nbytes}")
            log.debug("%s arrived after %.3f s", what, time.monotonic() - t0)
            for ref in b.tensors:
                yield ref.name, _view(buf, ref)
            del buf
            room.release()
    finally:
        stop.set()


def read_all(store: Store, manifest: WeightsManifest, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of a full manifest as its own tensor (copied out of the buckets; cast to `dtype` if given).

    For a trainer that resumes from published weights: it needs random access, and it is not a hot path.
    """
    if manifest.kind != "full":
        raise ValueError(f"read_all takes a full version, not {manifest.describe()}")
    return {name: t.to(dtype or t.dtype, copy=True) for name, t in iter_manifest(store, manifest)}


def write_all(
    store: Store, job_id: str, version: int, tensors: Iterable[tuple[str, torch.Tensor]], cfg: WeightsConfig
) -> list[BucketRef]:
    """Every `(name, tensor)` into buckets of one writer (rank 0): a state dict published from one process."""
    writer = BucketWriter(store, job_id, version, cfg)
    for name, t in tensors:
        writer.add(name, t)
    return writer.finish()
