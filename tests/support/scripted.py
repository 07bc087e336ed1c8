"""A scripted engine for chat and agent tests: a random tiny model never calls a tool or hands off, so these tests
answer each turn with chosen text, as token ids of the model's tokenizer, and keep what the engine was given and
what it sampled, to compare with what the trainer reads."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from temporalio.client import Client

from rollart.activities.engines.base import Completion, Engine, EngineOutput
from rollart.contracts.rollouts import GroupRolloutInput, TrajectoryResult
from rollart.spec.config import SamplingParams
from rollart.spec.pools import queue_name

__all__ = ["ScriptedEngine", "SlowOn", "play_group"]


@dataclass
class ScriptedEngine(Engine):
    """Answers turn k with `replies[k]` (the last one after that), then eos; keeps each prompt and sampled ids.
    Subclasses choose a reply by the prompt (`reply`)."""

    tokenizer: object
    replies: list[str] = field(default_factory=list)
    prompts: list[list[int]] = field(default_factory=list)
    sampled: list[list[int]] = field(default_factory=list)

    async def start(self) -> None:
        pass

    def reply(self, prompt: list[int]) -> str:
        """The text of the turn the engine is asked for now (`prompts` already holds its prompt)."""
        return self.replies[min(len(self.prompts), len(self.replies)) - 1]

    async def generate(
        self, prompt: str | list[int], sampling: SamplingParams, request_id: str, priority: int = 0
    ) -> EngineOutput:
        assert isinstance(prompt, list), "chat turns reach the engine as token ids"
        self.prompts.append(prompt)
        text = self.reply(prompt)
        ids = [*self.tokenizer(text, add_special_tokens=False).input_ids, self.tokenizer.eos_token_id]
        self.sampled.append(ids)
        return EngineOutput(prompt, [Completion(ids, [-1.0] * len(ids), text, "stop")], 0, 0)

    async def shutdown(self) -> None:
        pass

    def tokens_generated(self) -> int:
        return 0


@dataclass
class SlowOn(ScriptedEngine):
    """A scripted engine that takes `delay_s` over the turn it is asked for k-th (0 first), for each k in `slow`."""

    slow: tuple[int, ...] = (0,)
    delay_s: float = 1.5

    async def generate(
        self, prompt: str | list[int], sampling: SamplingParams, request_id: str, priority: int = 0
    ) -> EngineOutput:
        if len(self.prompts) in self.slow:
            await asyncio.sleep(self.delay_s)
        return await super().generate(prompt, sampling, request_id, priority)


async def play_group(client: Client, inp: GroupRolloutInput, workflow_id: str) -> list[TrajectoryResult]:
    """One GroupRolloutWorkflow of `inp` to its end, on its job's control queue: each member's result."""
    return await client.execute_workflow(
        "GroupRolloutWorkflow",
        inp,
        id=workflow_id,
        task_queue=queue_name("control", inp.queue_prefix),
        result_type=list[TrajectoryResult],
    )
