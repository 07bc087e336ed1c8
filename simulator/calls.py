"""SimCalls: rollart's `Calls` answered by the simulated world, each call after its virtual-time latency.

The rollout driver (workflows/driver) runs unchanged on it: resets, steps and closes open and drive simulated
env sessions (`TaskProfile`: latency, failures, episode lengths, token counts), generations go to the simulated
engines (`Cluster.route`: the shared queue or the private queue session affinity pins), rewards and single-turn
checks to the serverless pool. Each call first costs the orchestration's `Overheads.activity_s`.

The token bookkeeping rides in the strings the driver passes back and forth: an observation is
`env:context:new` (the prompt's tokens so far and those added since the trajectory's previous turn, which a
pinned engine holds in its prefix cache), an action `a<tokens>`.

A generation's result names its engine as a vLLM worker's does: `worker_id` the engine's name, `queue` its
private queue (`h800@h800-3`), and `pressure` its `EnginePressure` as the request ends — its scheduler's running
and waiting requests, KV usage, and its cumulative prefill and decode counts (`SimEngine`), from which
`generate_pool: auto` measures each pool's rates. The driver carries both into the trajectory's result
(`engine_worker`, `pressure`; `engine_pool` is the task's `generate_pool` as launched).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from rollart.contracts.activities import (
    ActivityName,
    CheckInput,
    CloseInput,
    EnvHandle,
    GroupHandle,
    GroupResetInput,
    GroupStepInput,
    PromptsInput,
    ResetInput,
    RewardBatchInput,
    RewardInput,
    RewardResult,
    StepInput,
    StepResult,
)
from rollart.contracts.errors import ErrorType
from rollart.contracts.generation import (
    Completion,
    EnginePressure,
    GenerateBatchInput,
    GenerateInput,
    GenerateResult,
    LiveEnginesInput,
    LiveEnginesResult,
)
from rollart.simulator.cluster import Cluster
from rollart.simulator.engine import Finished, SimEngine
from rollart.simulator.models import FifoCores, Overheads, TaskProfile
from rollart.workflows.driver.calls import CallFailed

__all__ = ["CallCounts", "SimCalls"]

log = logging.getLogger("rollart.simulator")
log.setLevel(logging.ERROR)  # masked failures are counted, not logged one by one


@dataclass
class _Session:
    """An env session of one trajectory or a lockstep group: each member's planned length and turns so far."""

    profile: TaskProfile
    lengths: list[int]
    turns: list[int]
    context: list[int]


@dataclass
class CallCounts:
    """Calls made, by activity, and env failures injected."""

    calls: dict[str, int] = field(default_factory=dict)
    failures: int = 0

    def add(self, activity: ActivityName) -> None:
        self.calls[activity.value] = self.calls.get(activity.value, 0) + 1


class SimCalls:
    """`Calls` on the simulated cluster; one instance serves a whole run."""

    logger = log

    def __init__(
        self, cluster: Cluster, profiles: dict[str, TaskProfile], overheads: Overheads, rng: random.Random
    ) -> None:
        self.cluster, self.profiles, self.overheads, self.rng = cluster, profiles, overheads, rng
        self.sessions: dict[str, _Session] = {}
        self.counts = CallCounts()
        self._cores = FifoCores(overheads.cores)
        self._ids = itertools.count()
        self._handlers = {
            ActivityName.RESET: self._reset,
            ActivityName.RESET_GROUP: self._reset_group,
            ActivityName.STEP: self._step,
            ActivityName.STEP_GROUP: self._step_group,
            ActivityName.CLOSE: self._close,
            ActivityName.GENERATE: self._generate,
            ActivityName.GENERATE_BATCH: self._generate_batch,
            ActivityName.REWARD: self._reward,
            ActivityName.REWARD_BATCH: self._reward_batch,
            ActivityName.PROMPTS: self._prompts,
            ActivityName.CHECK: self._check,
            ActivityName.LIVE_ENGINES: self._live_engines,
        }

    async def call(
        self,
        activity: ActivityName,
        arg: BaseModel,
        *,
        queue: str,
        result_type: Any = None,
        timeout_s: float | None = None,
        start_wait_s: float | None = None,
        heartbeat_s: float | None = None,
    ) -> Any:
        handler = self._handlers.get(activity)
        if handler is None:
            raise CallFailed(activity.value, f"not simulated: {activity.value}", error_type=ErrorType.INVALID_INPUT)
        self.counts.add(activity)
        return await handler(arg, queue)

    async def _wait(self, latency: float) -> None:
        """A call's own latency plus the orchestration's per-activity overhead (and its wait for a core), in one
        timer."""
        await asyncio.sleep(self.orchestration_wait() + latency)

    def orchestration_wait(self) -> float:
        """What one more activity (or child start) costs the orchestration now, its wait for a CPU core included."""
        o = self.overheads
        if not o.activity_cpu_s:
            return o.activity_s
        return o.activity_s + self._cores.wait(asyncio.get_running_loop().time(), o.activity_cpu_s)

    # ------------------------------------------------------------ env sessions

    def _profile(self, env: str) -> TaskProfile:
        try:
            return self.profiles[env]
        except KeyError:
            raise CallFailed("reset", f"no simulated env {env!r}", error_type=ErrorType.UNKNOWN_COMPONENT) from None

    def _open(self, profile: TaskProfile, members: int) -> tuple[str, list[str]]:
        """A session: each member's length drawn (geometric in done_p), its first observation."""
        lengths = [self._length(profile) for _ in range(members)]
        sid = f"s{next(self._ids)}"
        self.sessions[sid] = _Session(profile, lengths, [0] * members, [profile.prompt_tokens] * members)
        obs = f"{profile.env}:{profile.prompt_tokens}:{profile.prompt_tokens}"
        return sid, [obs] * members

    def _length(self, profile: TaskProfile) -> int:
        turns = 1
        while self.rng.random() >= profile.done_p and turns < 1000:
            turns += 1
        return turns

    async def _fail_maybe(self, activity: str, p: float, latency: float) -> None:
        await self._wait(latency)
        if p and self.rng.random() < p:
            self.counts.failures += 1
            raise CallFailed(activity, f"{ErrorType.ENV_BROKEN.value}: injected", error_type=ErrorType.ENV_BROKEN)

    async def _reset(self, inp: ResetInput, queue: str) -> EnvHandle:
        profile = self._profile(inp.env)
        await self._fail_maybe("reset", profile.reset_failure_p, profile.reset.draw(self.rng))
        sid, [obs] = self._open(profile, 1)
        return EnvHandle(session_id=sid, queue=f"{queue}@env", worker_id="env", observation=obs)

    async def _reset_group(self, inp: GroupResetInput, queue: str) -> GroupHandle:
        profile = self._profile(inp.env)
        p_any = 1.0 - (1.0 - profile.reset_failure_p) ** inp.size
        await self._fail_maybe("reset_group", p_any, profile.reset.max_of(inp.size, self.rng))
        sid, obs = self._open(profile, inp.size)
        return GroupHandle(session_id=sid, queue=f"{queue}@env", worker_id="env", observations=obs)

    def _advance(self, s: _Session, member: int, action: str) -> StepResult:
        """One turn of one member: the action's tokens and a new observation join its context."""
        s.turns[member] += 1
        added = int(action[1:]) + s.profile.obs_tokens
        s.context[member] += added
        done = s.turns[member] >= s.lengths[member]
        return StepResult(observation=f"{s.profile.env}:{s.context[member]}:{added}", reward=0.0, done=done)

    async def _step(self, inp: StepInput, queue: str) -> StepResult:
        s = self.sessions[inp.session_id]
        await self._fail_maybe("step", s.profile.step_failure_p, s.profile.step.draw(self.rng))
        return self._advance(s, 0, inp.action)

    async def _step_group(self, inp: GroupStepInput, queue: str) -> list[StepResult | None]:
        s = self.sessions[inp.session_id]
        k = sum(a is not None for a in inp.actions)
        p_any = 1.0 - (1.0 - s.profile.step_failure_p) ** k
        await self._fail_maybe("step_group", p_any, s.profile.step.max_of(k, self.rng))
        return [None if a is None else self._advance(s, m, a) for m, a in enumerate(inp.actions)]

    async def _close(self, inp: CloseInput, queue: str) -> None:
        await self._wait(self.overheads.close_s)
        self.sessions.pop(inp.session_id, None)

    # ------------------------------------------------------------ generation

    def _submit(self, prompt: str, queue: str, n: int, priority: int) -> tuple[SimEngine, int, int, Any]:
        """One prompt on the engine `queue` names: (engine, prompt tokens, output tokens, its future)."""
        env, context, new = prompt.split(":")
        engine = self.cluster.route(queue)
        out = self.profiles[env].output_tokens(self.rng)
        new_tokens = int(new) if "@" in queue else int(context)  # a pinned engine holds the rest in its prefix cache
        return (
            engine,
            int(context),
            out,
            engine.submit(int(context), out, n=n, priority=priority, new_tokens=new_tokens),
        )

    @staticmethod
    def _pressure(engine: SimEngine) -> EnginePressure:
        """What the engine reports with a generation: its scheduler now and its counts since it started."""
        return EnginePressure(
            running=engine.running_requests,
            waiting=engine.waiting_requests,
            kv_usage=engine.kv_usage,
            prefill_tokens=engine.prefill_tokens,
            prefill_s=engine.prefill_s,
            decode_tokens=engine.decode_tokens,
            decode_s=engine.decode_s,
            decode_steps=engine.decode_steps,
            max_batch=engine.max_num_seqs,
        )

    @classmethod
    def _result(
        cls, engine: SimEngine, prompt_tokens: int, out: int, n: int, fin: Finished, key: str, pressure: EnginePressure
    ) -> GenerateResult:
        completion = Completion(text=f"a{out}", num_tokens=out, finish_reason="length", message=None)
        return GenerateResult(
            completions=[completion] * n,
            prompt_tokens=prompt_tokens,
            policy_version=fin.version_start,
            policy_version_end=fin.version_end,
            data_key=key,
            worker_id=engine.name,
            queue=f"{engine.pool}@{engine.name}",
            pressure=pressure,
        )

    async def _generate(self, inp: GenerateInput, queue: str) -> GenerateResult:
        n = inp.sampling.n
        engine, tokens, out, future = self._submit(inp.prompt, queue, n, inp.priority)
        fin = await future
        pressure = self._pressure(engine)  # as the request ends, before the result's trip back
        await self._wait(0.0)
        return self._result(engine, tokens, out, n, fin, inp.data_key, pressure)

    async def _generate_batch(self, inp: GenerateBatchInput, queue: str) -> list[GenerateResult]:
        """Every prompt on the one engine that took the call, each its own request (they batch there)."""
        engine = self.cluster.route(queue)
        target, n = f"{engine.pool}@{engine.name}", inp.sampling.n
        submitted = [self._submit(p, target, n, inp.priority) for p in inp.prompts]
        done = await asyncio.gather(*(f for *_, f in submitted))
        pressure = self._pressure(engine)
        await self._wait(0.0)
        return [
            self._result(e, t, o, n, fin, k, pressure) for (e, t, o, _), fin, k in zip(submitted, done, inp.data_keys)
        ]

    async def _live_engines(self, inp: LiveEnginesInput, queue: str) -> LiveEnginesResult:
        await self._wait(0.0)
        return LiveEnginesResult(queues=self.cluster.private_queues(inp.pool))

    # ------------------------------------------------------------ single-turn and rewards

    async def _prompts(self, inp: PromptsInput, queue: str) -> list[str]:
        profile = self._profile(inp.env)
        await self._wait(self.overheads.light.draw(self.rng))
        return [f"{profile.env}:{profile.prompt_tokens}:{profile.prompt_tokens}"] * len(inp.seeds)

    async def _check(self, inp: CheckInput, queue: str) -> list[list[StepResult]]:
        await self._wait(self.overheads.light.draw(self.rng))
        done = StepResult(observation="", reward=0.0, done=True, info={}, messages=None)
        return [[done for _ in row] for row in inp.answers]

    async def _reward(self, inp: RewardInput, queue: str) -> RewardResult:
        await self._wait(self.overheads.reward.draw(self.rng))
        return self._draw_reward()

    async def _reward_batch(self, inp: RewardBatchInput, queue: str) -> list[RewardResult]:
        await self._wait(self.overheads.reward.draw(self.rng))
        return [self._draw_reward() for _ in inp.transcripts]

    def _draw_reward(self) -> RewardResult:
        """Success or not at even odds: the scheduling does not depend on it (no dynamic sampling here)."""
        ok = self.rng.random() < 0.5
        return RewardResult(value=1.0 if ok else 0.0, success=ok)
