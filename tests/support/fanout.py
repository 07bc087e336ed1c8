"""A workflow for autoscaler tests: N reward activities at once on the serverless queue, with the real policy."""

from __future__ import annotations

import asyncio

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from rollart.contracts.activities import RewardInput, RewardResult, Transcript, TurnRecord
    from rollart.spec.pools import Pool
    from rollart.workflows import policies


@workflow.defn(name="FanOutRewards")
class FanOutRewards:
    """Scores `n` one-turn transcripts with `reward`, each told to take `sleep_s` (tests.support.rewards:slow)."""

    @workflow.run
    async def run(self, n: int, reward: str, sleep_s: float) -> list[RewardResult]:
        def one(i: int) -> RewardInput:
            turn = TurnRecord(observation=f"o{i}", action="a", info={"sleep_s": sleep_s})
            return RewardInput(reward=reward, transcript=Transcript(task="t", seed=i, turns=[turn]))

        return list(
            await asyncio.gather(
                *(
                    workflow.execute_activity(
                        "reward",
                        one(i),
                        task_queue=Pool.SERVERLESS.value,
                        result_type=RewardResult,
                        **policies.REWARD.kwargs(),
                    )
                    for i in range(n)
                )
            )
        )
