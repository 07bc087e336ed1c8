"""One trajectory with its own env session: what it has seen so far, and each of its calls."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rollart.contracts.activities import (
    ActivityName,
    EnvHandle,
    EnvOptions,
    GroupHandle,
    ResetInput,
    RewardInput,
    RewardResult,
    StepInput,
    StepResult,
    Transcript,
    TurnRecord,
    turn_key,
)
from rollart.contracts.generation import GenerateInput, GenerateResult, WeightsRef
from rollart.contracts.rollouts import TrajectoryInput, TrajectoryResult
from rollart.spec.chat import ChatMessage
from rollart.spec.pools import queue_name
from rollart.workflows.driver.affinity import Pin, generate_on
from rollart.workflows.driver.calls import Calls
from rollart.workflows.driver.priority import request_priority
from rollart.workflows.driver.session import call_sticky, close_session

__all__ = ["Episode", "uncached_prompt_tokens"]


def uncached_prompt_tokens(gens: list[GenerateResult]) -> int:
    """The prompt tokens of a trajectory's turns that a prefix cache would not hold: each turn's prompt past the
    turn before's prompt and reply (its new observation), the first turn's whole. What a turn costs to prefill
    on the engine that served the turn before (session affinity), and what automatic affinity plans on."""
    total, context = 0, 0
    for gen in gens:
        total += max(0, gen.prompt_tokens - context)
        context = gen.prompt_tokens + gen.completions[0].num_tokens
    return total


@dataclass
class Episode:
    """The state of one episode between calls; a unit of `lockstep.play` (start, generate, step, score, close)."""

    calls: Calls
    inp: TrajectoryInput
    trajectory_id: str
    handle: EnvHandle | None = None
    observation: str = ""
    turns: list[TurnRecord] = field(default_factory=list)
    gens: list[GenerateResult] = field(default_factory=list)
    done: bool = False
    restores: int = 0
    error: str | None = None  # why the episode failed, once it has
    error_type: str | None = None  # the job's own fault, when it is one (CallFailed.job_fault)
    pin: Pin = field(default_factory=Pin)  # the engine serving its turns (session affinity)
    new_messages: list[ChatMessage] | None = None  # a chat env's messages not yet sent to the model (None: text env)
    _pending: GenerateResult | None = None  # this turn's generation, until it is stepped
    predicted_turns: float | None = None  # its predicted length (engine.priority: predicted): a finished sibling's

    @property
    def over(self) -> bool:
        """No more turns to play: the env said done, or max_turns is reached."""
        return self.done or len(self.turns) >= self.inp.task.max_turns

    @property
    def playing(self) -> bool:
        """Turns left to play, and no failure so far."""
        return self.error is None and not self.over

    def predicted(self) -> float | None:
        """Its predicted length in turns: a finished sibling's, else its task's recent mean (None: unknown)."""
        return self.predicted_turns if self.predicted_turns is not None else self.inp.predicted_turns

    @property
    def members(self) -> list[Episode]:
        """The trajectories sharing this episode's session: itself."""
        return [self]

    @property
    def owner_id(self) -> str:
        return self.trajectory_id

    def queue(self, pool: object) -> str:
        """The task queue of `pool` for this episode's job."""
        return queue_name(str(pool), self.inp.queue_prefix)

    async def start(self) -> None:
        """Reset an env session on the task's env pool."""
        task = self.inp.task
        self.handle = await self.calls.call(
            ActivityName.RESET,
            ResetInput(
                env=task.env,
                env_args=task.env_args,
                seed=self.inp.seed,
                trajectory_id=self.trajectory_id,
                options=EnvOptions.of(task),
            ),
            queue=self.queue(task.env_queue),
            result_type=EnvHandle,
        )
        self.observation = self.handle.observation
        self.new_messages = self.handle.messages

    @property
    def chat(self) -> bool:
        """Whether the env speaks chat messages (its conversation grows token by token on the engine)."""
        return self.handle is not None and self.handle.messages is not None

    async def generate(self) -> None:
        """Sample this turn's action from the current observation (kept for `step`), on the engine of its previous
        turn when it can (workflows/driver/affinity.py)."""
        task, inp = self.inp.task, self.inp
        weights = WeightsRef(job_id=inp.job_id, min_version=inp.min_version) if inp.job_id else None
        self._pending = await generate_on(
            self.calls,
            inp.affinity,
            self.pin,
            ActivityName.GENERATE,
            GenerateInput(
                prompt=self.observation,
                sampling=task.sampling,
                weights=weights,
                prompt_format=task.prompt,
                data_key=turn_key(inp.job_id, self.trajectory_id, len(self.turns)),
                priority=request_priority(inp.priority, len(self.turns), self.predicted()),
                **self._chat_turn(),
            ),
            shared=self.queue(task.generate_pool),
            result_type=GenerateResult,
        )

    def _chat_turn(self) -> dict[str, Any]:
        """A chat turn's part of its GenerateInput: the new messages, the tools (first turn), the turn it continues."""
        if not self.chat:
            return {}
        assert self.handle is not None
        messages = self.new_messages or []
        system = self.inp.task.prompt.system
        if not self.gens and system and (not messages or messages[0].role != "system"):
            messages = [ChatMessage(role="system", content=system), *messages]  # the task's, unless the env's own
        return {
            "messages": messages,
            "tools": None if self.gens else self.handle.tools,
            "prefix_key": self.gens[-1].data_key if self.gens else None,
            "tool_parser": self.inp.task.tool_parser,
        }

    async def step(self) -> None:
        """Play the generated text as this turn's action, on the worker holding the session (restored if gone)."""
        gen, self._pending = self._pending, None
        assert gen is not None and self.handle is not None
        message = gen.completions[0].message if self.chat else None
        step = await call_sticky(
            self.calls,
            self,
            ActivityName.STEP,
            lambda h: StepInput(session_id=h.session_id, action=gen.completions[0].text, message=message),
            result_type=StepResult,
            timeout_s=self.handle.step_timeout_s,
        )
        self.record(gen, step)

    def rehome(self, handle: GroupHandle) -> None:
        """The session now lives on another worker (restored); a chat env's opening and tools stay as they were."""
        old = self.handle
        self.handle = EnvHandle(
            session_id=handle.session_id,
            queue=handle.queue,
            worker_id=handle.worker_id,
            observation=self.observation,
            step_timeout_s=handle.step_timeout_s,
            sticky_start_s=handle.sticky_start_s,
            messages=old.messages if old else None,
            tools=old.tools if old else None,
        )

    def record(self, gen: GenerateResult, step: StepResult) -> None:
        """Book one played turn: the action the model chose and what the env answered."""
        self.gens.append(gen)
        self.turns.append(
            TurnRecord(
                observation=self.observation,
                action=gen.completions[0].text,
                env_reward=step.reward,
                done=step.done,
                info=step.info,
                message=gen.completions[0].message,
            )
        )
        self.observation = step.observation
        self.new_messages = step.messages if self.chat else None
        self.done = step.done

    def transcript(self) -> Transcript:
        """The episode as a reward function sees it."""
        return Transcript(
            task=self.inp.task.name, seed=self.inp.seed, turns=self.turns, final_observation=self.observation
        )

    async def score(self) -> list[RewardResult]:
        """Score the finished episode (on "serverless", or the generation pool when colocated)."""
        task = self.inp.task
        score = await self.calls.call(
            ActivityName.REWARD,
            RewardInput(reward=task.reward, transcript=self.transcript(), reward_args=task.reward_args),
            queue=self.queue(task.reward_queue),
            result_type=RewardResult,
        )
        return [score]

    async def close(self) -> None:
        """Release the env session, if one was opened."""
        if self.handle is not None:
            await close_session(self.calls, self.handle)

    def results(self, scores: list[RewardResult] | None) -> list[TrajectoryResult]:
        """The unit's results: completed with its score, or failed with its error (never scored)."""
        if scores is None:
            return [self.result(status="failed", error=self.error, error_type=self.error_type)]
        return [self.result(status="completed", reward=scores[0].value, success=scores[0].success)]

    def result(self, **outcome: Any) -> TrajectoryResult:
        """The compact result; `outcome` gives status and reward/success or error."""
        versions = [v for g in self.gens for v in (g.policy_version, g.policy_version_end)]
        return TrajectoryResult(
            trajectory_id=self.trajectory_id,
            task=self.inp.task.name,
            seed=self.inp.seed,
            group_id=self.inp.group_id,
            turns=len(self.turns),
            policy_version_min=min(versions) if versions else None,
            policy_version_max=max(versions) if versions else None,
            prompt_tokens=sum(g.prompt_tokens for g in self.gens),
            completion_tokens=sum(c.num_tokens for g in self.gens for c in g.completions),
            uncached_prompt_tokens=uncached_prompt_tokens(self.gens),
            turn_keys=[g.data_key for g in self.gens],
            env_worker=self.handle.worker_id if self.handle else None,
            restores=self.restores,
            engine_worker=self.pin.worker or None,
            engine_pool=self.inp.task.generate_pool if self.gens else None,
            engine_moves=self.pin.moves,
            pressure=self.pin.pressure,
            **outcome,
        )
