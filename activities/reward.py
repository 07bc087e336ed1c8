"""The reward activity: stateless scoring of a finished episode, on the elastic "serverless" pool."""

from __future__ import annotations

import asyncio
import math

from rollart.activities.errors import unknown_component
from rollart.activities.types import RewardBatchInput, RewardInput, RewardResult, Transcript
from rollart.infra.registry import UnknownComponentError, lookup_reward
from temporalio import activity
from temporalio.exceptions import ApplicationError

__all__ = ["RewardActivities", "as_reward_result"]


class RewardActivities:
    """Registers `reward`; reward functions are looked up by name on every call (cheap: a dict)."""

    @activity.defn(name="reward")
    async def reward(self, inp: RewardInput) -> RewardResult:
        """Run the named reward function on the transcript."""
        (result,) = await self._score(inp.reward, [inp.transcript])
        return result

    @activity.defn(name="reward_batch")
    async def reward_batch(self, inp: RewardBatchInput) -> list[RewardResult]:
        """Score many transcripts in one call (single-turn groups: one activity per group, not per sample)."""
        return await self._score(inp.reward, inp.transcripts)

    async def _score(self, name: str, transcripts: list[Transcript]) -> list[RewardResult]:
        try:
            entry = lookup_reward(name)
        except UnknownComponentError as e:
            raise unknown_component(str(e)) from e

        def run_all() -> list[object]:
            return [entry.fn(t) for t in transcripts]

        try:
            values = await asyncio.to_thread(run_all)
        except Exception as e:
            raise ApplicationError(f"reward {name!r} raised {type(e).__name__}: {e}", type="RewardError") from e
        return [as_reward_result(v, name) for v in values]


def as_reward_result(value: object, name: str) -> RewardResult:
    """Accept a `RewardResult` or a plain number (a number r counts as a success when r ≥ 1)."""
    if isinstance(value, RewardResult):
        result = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        result = RewardResult(value=float(value), success=float(value) >= 1.0)
    else:
        raise ApplicationError(
            f"reward {name!r} returned {value!r}; return a float or a RewardResult", type="InvalidInput",
            non_retryable=True,
        )
    if not math.isfinite(result.value):
        raise ApplicationError(f"reward {name!r} returned {result.value}", type="InvalidInput", non_retryable=True)
    return result
