"""The LoRA adapters one vLLM engine serves: the current version, and the replaced ones still draining.

Why a module of its own: serving a new version is `add_lora` and nothing else — no pause, no reload of the
base weights — but a replaced adapter may only leave vLLM (and its directory the disk: vLLM loads adapters
lazily and may read them again after evicting them) once the last request that started on it is done. This
keeps that bookkeeping; `VllmEngine` asks it which adapter a new request carries.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollart.activities.engines.base import WeightsBlobError, check_adapter_dir

__all__ = ["MAX_LORAS", "Adapter", "VllmAdapters", "vllm_lora_rank"]

log = logging.getLogger(__name__)

MAX_LORAS = 2
"""Adapters vLLM batches at once: the newest version and the one whose requests are still draining."""

_VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_lora_rank(rank: int) -> int:
    """vLLM's `max_lora_rank` for adapters up to `rank`: it takes only these sizes (the smallest that fits)."""
    for size in _VLLM_LORA_RANKS:
        if size >= rank:
            return size
    raise ValueError(f"LoRA rank {rank} is above vLLM's largest max_lora_rank {_VLLM_LORA_RANKS[-1]}")


@dataclass(eq=False)
class Adapter:
    """One adapter version: its vLLM request, where its files are, and how many requests use it."""

    request: Any  # vllm.lora.request.LoRARequest
    version: int
    path: Path
    owned: bool
    in_flight: int = 0
    retired: bool = False


class VllmAdapters:
    """The current adapter (None: the base weights alone) and the replaced ones still in use.

    `llm` gives the engine's `AsyncLLM` (None once it is shut down). vLLM caches adapters by integer id, so
    every adapter gets a new one, whatever its job or version.
    """

    def __init__(self, llm: Callable[[], Any], max_rank: int) -> None:
        self._llm = llm
        self.max_rank = max_rank
        self.current: Adapter | None = None
        self._live: set[Adapter] = set()  # added to vLLM and not yet removed
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task] = set()

    async def add(self, path: Path, version: int, owned: bool) -> Adapter:
        """Check the adapter in `path` and have vLLM load it now (not in the first request that carries it)."""
        from vllm.lora.request import LoRARequest

        await asyncio.to_thread(check_adapter_dir, path, self.max_rank)
        lora_id = next(self._ids)
        request = LoRARequest(f"policy-v{version}-{lora_id}", lora_id, str(path))
        try:
            await self._llm().add_lora(request)
        except Exception as e:  # vLLM refused the files; it keeps serving what it served
            raise WeightsBlobError(f"vLLM could not load the adapter in {path}: {type(e).__name__}: {e}") from e
        adapter = Adapter(request, version, path, owned)
        self._live.add(adapter)
        return adapter

    def serve(self, adapter: Adapter | None) -> None:
        """New requests carry `adapter` from now on; the one they carried leaves once its requests are done."""
        old, self.current = self.current, adapter
        if old is not None and old is not adapter:
            old.retired = True
            self._drop_when_drained(old)

    def begin(self) -> Adapter | None:
        """A request starts: the adapter it carries (counted as in use until `end`)."""
        adapter = self.current
        if adapter is not None:
            adapter.in_flight += 1
        return adapter

    def end(self, adapter: Adapter | None) -> None:
        """A request that carried `adapter` is done (finished, failed or cancelled)."""
        if adapter is not None:
            adapter.in_flight -= 1
            self._drop_when_drained(adapter)

    def close(self) -> None:
        """The engine is gone: delete the directories the engine owned."""
        for adapter in self._live:
            if adapter.owned:
                shutil.rmtree(adapter.path, ignore_errors=True)
        self._live.clear()
        self.current = None

    def _drop_when_drained(self, adapter: Adapter) -> None:
        if not adapter.retired or adapter.in_flight or adapter not in self._live:
            return
        self._live.discard(adapter)
        task = asyncio.ensure_future(self._remove(adapter))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _remove(self, adapter: Adapter) -> None:
        llm = self._llm()
        try:
            if llm is not None:
                await llm.remove_lora(adapter.request.lora_int_id)
        except Exception as e:  # the engine is going away or gone: nothing left to free
            log.debug("removing adapter v%d: %s", adapter.version, e)
        if adapter.owned:
            await asyncio.to_thread(shutil.rmtree, adapter.path, True)
        log.debug("adapter v%d left vLLM (%s)", adapter.version, adapter.path)
