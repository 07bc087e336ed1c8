"""The reward activity: stateless scoring of finished episodes, on the elastic "serverless" pool (or colocated).

Reward functions are looked up by name on every call (a dict). Reward models are loaded
lazily, once per worker process and `reward_args`, on first use, then reused by every call.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from temporalio import activity

from rollart.activities.errors import bad_input, unknown_component
from rollart.activities.heartbeat import heartbeating
from rollart.contracts.activities import RewardBatchInput, RewardInput, RewardResult, Transcript
from rollart.contracts.errors import ErrorType
from rollart.spec.registry import RewardEntry, UnknownComponentError, lookup_reward

__all__ = ["HEARTBEAT_EVERY_S", "RewardActivities"]

HEARTBEAT_EVERY_S = 2.0
"""A reward model may score for seconds: beat so a worker that died mid-call is noticed (policies.REWARD)."""


class RewardActivities:
    """Registers `reward` and `reward_batch`; holds the reward models this worker has loaded."""

    def __init__(self) -> None:
        self._scorers: dict[tuple[str, str], Callable[[Transcript], Any]] = {}
        self._loading: dict[tuple[str, str], asyncio.Lock] = {}
        self.loads = 0
        """How many reward models this worker has loaded (each once per name and args)."""

    @activity.defn(name="reward")
    async def reward(self, inp: RewardInput) -> RewardResult:
        """Run the named reward on the transcript."""
        (result,) = await self._score(inp.reward, inp.reward_args, [inp.transcript])
        return result

    @activity.defn(name="reward_batch")
    async def reward_batch(self, inp: RewardBatchInput) -> list[RewardResult]:
        """Score many transcripts in one call (single-turn groups: one activity per group, not per sample)."""
        return await self._score(inp.reward, inp.reward_args, inp.transcripts)

    async def _score(self, name: str, args: dict[str, Any], transcripts: list[Transcript]) -> list[RewardResult]:
        try:
            entry = lookup_reward(name)
        except UnknownComponentError as e:
            raise unknown_component(str(e)) from e
        async with heartbeating(HEARTBEAT_EVERY_S):
            scorer = await self._scorer(entry, args)

            def run_all() -> list[object]:
                return [scorer(t) for t in transcripts]

            try:
                values = await asyncio.to_thread(run_all)
            except Exception as e:
                raise ErrorType.REWARD_ERROR.error(f"reward {name!r} raised {type(e).__name__}: {e}") from e
        return [RewardResult.of(v, name) for v in values]

    async def _scorer(self, entry: RewardEntry, args: dict[str, Any]) -> Callable[[Transcript], Any]:
        """The function itself, or the reward model for these args: loaded on first use (in a thread), then reused."""
        if not entry.is_model:
            try:
                return entry.load(args)
            except TypeError as e:
                raise bad_input(str(e)) from e
        key = (entry.name, json.dumps(args, sort_keys=True, default=str))
        if key in self._scorers:
            return self._scorers[key]
        async with self._loading.setdefault(key, asyncio.Lock()):  # concurrent first calls load it once
            if key not in self._scorers:
                try:
                    entry.check_args(args)
                except (TypeError, ValueError, LookupError) as e:  # LookupError: an unknown `base` reward, say
                    raise bad_input(f"reward {entry.name!r}: bad reward_args: {e}") from e
                activity.logger.info("loading reward model %r with %s", entry.name, args)
                self._scorers[key] = await asyncio.to_thread(entry.load, args)
                self.loads += 1
        return self._scorers[key]
