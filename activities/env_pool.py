"""A cpu worker's pool of pre-reset envs: hedged resets against the long tail, spares kept per seed.

A reset asks for n envs reset from one seed (1 for a trajectory, the group size
for a lockstep group). Ready spares of that (env, args, seed) are taken first;
for the rest the pool starts `missing + size − 1` resets at once and answers
with the first `missing` that succeed. Late finishers become spares for the next
reset of the same seed (the other members of a GRPO group, a retried reset, a
restore); spares are bounded by `size` per key and dropped after `max_idle_s`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any

__all__ = ["ResetPool", "close_quietly"]

log = logging.getLogger(__name__)

Ready = tuple[Any, str]  # (env, its first observation)


@dataclass
class _Spare:
    env: Any
    observation: str
    since: float


class ResetPool:
    """Spares per key; `take` never waits for more resets than it needs."""

    def __init__(self, max_idle_s: float = 120.0, discard: Callable[[Any], None] | None = None) -> None:
        self.max_idle_s = max_idle_s
        self._discard = discard or close_quietly  # how a spare nobody will use is closed (the env threads, in a worker)
        self._spares: dict[Hashable, deque[_Spare]] = {}
        self._limits: dict[Hashable, int] = {}
        self.hits = 0
        self.started = 0

    def spares(self, key: Hashable) -> int:
        return len(self._spares.get(key, ()))

    async def take(self, key: Hashable, n: int, size: int, reset_one: Callable[[], Awaitable[Ready]]) -> list[Ready]:
        """n envs reset for `key`: spares first, then hedged fresh resets; raises the first error if too few succeed."""
        self._expire()
        self._limits[key] = max(1, size)
        got: list[Ready] = []
        spares = self._spares.get(key)
        while spares and len(got) < n:
            s = spares.popleft()
            got.append((s.env, s.observation))
            self.hits += 1
        missing = n - len(got)
        if missing == 0:
            return got
        launched = missing + max(0, size - 1)
        self.started += launched
        pending = {asyncio.ensure_future(reset_one()) for _ in range(launched)}
        errors: list[BaseException] = []
        while pending and len(got) < n:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if t.exception() is not None:
                    errors.append(t.exception())  # type: ignore[arg-type]
                elif len(got) < n:
                    got.append(t.result())
                else:
                    self._keep(key, t.result())
        for t in pending:  # hedges still running: they become spares when (if) they succeed
            t.add_done_callback(
                lambda t, key=key: None if t.cancelled() or t.exception() else self._keep(key, t.result())
            )
        if len(got) < n:
            for env, observation in got:
                self._keep(key, (env, observation))
            raise errors[0]
        return got

    def _keep(self, key: Hashable, ready: Ready) -> None:
        spares = self._spares.setdefault(key, deque())
        if len(spares) >= self._limits.get(key, 1):
            self._discard(ready[0])
            return
        spares.append(_Spare(env=ready[0], observation=ready[1], since=time.monotonic()))

    def _expire(self) -> None:
        now = time.monotonic()
        for key in list(self._spares):
            spares = self._spares[key]
            while spares and now - spares[0].since > self.max_idle_s:
                self._discard(spares.popleft().env)
            if not spares:
                del self._spares[key]


def close_quietly(env: Any) -> None:
    """Close a spare nobody will use; an env whose close raises is only logged."""
    try:
        env.close()
    except Exception:  # a spare nobody will use: nothing to do but log
        log.exception("closing a spare env failed")
