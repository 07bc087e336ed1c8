"""The peak resident memory of this process over a block of code, sampled from a thread.

Why: publishing weights must not hold a second copy of the model, and "about one bucket beyond the
shard" is a claim to measure, in the step's metrics and in `bench size`. tracemalloc does not see
torch's allocations; the process's RSS does.
"""

from __future__ import annotations

import threading
from types import TracebackType

import psutil

__all__ = ["PeakRss"]


class PeakRss:
    """`with PeakRss() as peak: ...`, then `peak.extra_bytes`: the most the RSS rose above its value at entry."""

    def __init__(self, every_s: float = 0.002) -> None:
        self.every_s = every_s
        self.start_bytes = 0
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc = psutil.Process()

    @property
    def extra_bytes(self) -> int:
        """Peak RSS during the block minus RSS at its start (0 if it never rose)."""
        return max(0, self.peak_bytes - self.start_bytes)

    def _sample(self) -> None:
        while not self._stop.wait(self.every_s):
            self.peak_bytes = max(self.peak_bytes, self._proc.memory_info().rss)

    def __enter__(self) -> PeakRss:
        self.start_bytes = self.peak_bytes = self._proc.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True, name="rollart-peak-rss")
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.peak_bytes = max(self.peak_bytes, self._proc.memory_info().rss)
