"""A workflow for the task-queue priority test: ranked generation requests through the driver's TemporalCalls."""

from __future__ import annotations

import asyncio

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from rollart.contracts.activities import ActivityName
    from rollart.contracts.generation import GenerateInput, GenerateResult
    from rollart.spec.config import SamplingParams
    from rollart.workflows.temporal_calls import TemporalCalls


@workflow.defn(name="RankedRequests")
class RankedRequests:
    """One request that holds the queue's only slot, then the ranked ones (`data_key` names each) at once."""

    @workflow.run
    async def run(self, queue: str, ranks: list[int]) -> None:
        calls = TemporalCalls()

        def request(key: str, rank: int) -> GenerateInput:
            return GenerateInput(prompt="p", sampling=SamplingParams(), data_key=key, priority=rank)

        blocker = asyncio.ensure_future(
            calls.call(ActivityName.GENERATE, request("blocker", 0), queue=queue, result_type=GenerateResult)
        )
        await workflow.sleep(0.5)  # the blocker is running: the rest wait on the queue
        ranked = [
            calls.call(ActivityName.GENERATE, request(f"r{i}:{rank}", rank), queue=queue, result_type=GenerateResult)
            for i, rank in enumerate(ranks)
        ]
        await asyncio.gather(blocker, *ranked)
