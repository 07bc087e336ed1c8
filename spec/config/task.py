"""A task of a job (`tasks[]`): its env and reward, where it generates, how it samples and prompts, its faults.

Pure validation: the env's and reward's own declarations of where they run are read by `resolve`, never here.
"""

from __future__ import annotations

import math
import random
from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from rollart.spec.config.base import Section
from rollart.spec.pools import Pool, PoolName

_Z99 = 2.3263478740408408  # the standard normal's 0.99 quantile

AUTO_POOL = "auto"
"""`generate_pool: auto`: the training workflow places the task (workflows/training/placement.py)."""

__all__ = [
    "AGENT_ENV",
    "AUTO_POOL",
    "FaultModel",
    "GroupPlay",
    "LatencyModel",
    "PromptFormat",
    "RewardPlacement",
    "SamplingParams",
    "TaskEnv",
    "TaskSpec",
]

AGENT_ENV = "agent"
"""The env name of a task played by an agent program (`env_args: {entry: ...}` or `{command: [...]}`): no env class,
the program talks to the policy through rollart's OpenAI-compatible endpoint (docs/envs.md, "Agent programs")."""

RewardPlacement = Literal["serverless", "colocated"]

GroupPlay = Literal["lockstep", "free"]
"""How a group's members play their turns (`rollout_unit: group`): together, a turn at a time, or each on its own."""
"""Where a task's reward runs: on the elastic "serverless" pool, or on the worker of its generation pool."""


class SamplingParams(Section):
    """How a task samples from the policy. `top_k = 0` means the full vocabulary (no truncation)."""

    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    max_tokens: int = Field(2, ge=1, le=4096)
    n: int = Field(1, ge=1, le=256)
    stop: list[str] = Field(default_factory=list)


class PromptFormat(Section):
    """How an env's observation becomes the text the policy is prompted with.

    Instruct models were trained on conversations, so by default (`chat: auto`) the observation is sent as
    the user's message through the model's own chat template (with `system` first, if given), ending where
    the assistant's reply starts; a model without a chat template (the tiny one) gets the observation as raw
    text. `always` refuses a model without a template; `never` sends raw text whatever the model.
    """

    chat: Literal["auto", "always", "never"] = "auto"
    system: str | None = Field(None, min_length=1, description="the system message, before the observation")

    @model_validator(mode="after")
    def _system_needs_a_template(self) -> PromptFormat:
        if self.system is not None and self.chat == "never":
            raise ValueError("prompt.system is sent through the chat template, which chat: never turns off")
        return self


class LatencyModel(Section):
    """A lognormal latency given by its median and its 99th percentile (a long tail: p99 ≫ median).

    ln(latency) ~ Normal(ln(median), σ) with σ = ln(p99 / median) / 2.3263 (the normal's 0.99 quantile).
    """

    median_s: float = Field(0.0, ge=0.0)
    p99_s: float = Field(0.0, ge=0.0)

    @model_validator(mode="after")
    def _p99_above_median(self) -> LatencyModel:
        if self.p99_s < self.median_s:
            raise ValueError(f"p99_s ({self.p99_s:g}) must be at least median_s ({self.median_s:g})")
        return self

    def draw(self, rng: random.Random) -> float:
        """One latency, in seconds: median · exp(σ·z); 0 when the median is 0. The one sampler of the model: the
        env's fault injection and the benchmarks' stand-in envs both wait what it draws."""
        if self.median_s <= 0.0:
            return 0.0
        if self.p99_s <= self.median_s:
            return self.median_s
        sigma = math.log(self.p99_s / self.median_s) / _Z99
        return self.median_s * math.exp(sigma * rng.gauss(0.0, 1.0))


class FaultModel(Section):
    """Injected env latency and failures (tests, benchmarks, chaos runs): any env can run under it.

    `reset_failure_p` / `step_failure_p`: probability that a reset / step raises instead of running.
    An injected step failure happens before the env is touched, so it is transient (retried); an
    injected reset failure is an env reset that raised (retried with a fresh env). `seed` makes the
    draws reproducible per worker process.
    """

    reset_latency: LatencyModel = Field(default_factory=LatencyModel)
    step_latency: LatencyModel = Field(default_factory=LatencyModel)
    reset_failure_p: float = Field(0.0, ge=0.0, le=1.0)
    step_failure_p: float = Field(0.0, ge=0.0, le=1.0)
    seed: int = 0


class TaskSpec(Section):
    """One task of a job: which env and reward, where it generates, how it samples.

    `env` and `reward` are registered names (`frozenlake`) or import paths of a
    user's own (`mypkg.envs:Maze`); an agent program's task (`env: agent`) may name no reward, when its run()
    returns it (`reward` None: nothing is routed to a reward pool). `reward_placement` says where the reward runs:
    `serverless` (on `reward_pool`, elastic, the default) or `colocated` (on the worker of
    `generate_pool`, competing with generation: the monolithic baseline). The pools are names the job
    declares (`JobSpec.pools`); the job checks each has the role its work needs.

    Where the env and reward *declare* they run (`@env(pool=...)`, `@reward(serverless=...)`) is
    read once, by `resolve` where the job is loaded, into `env_pool` and `reward_serverless`, so that
    it travels with the spec to the workflows as data. Validating a task reads no declaration.
    """

    claim_over_bytes: ClassVar[int] = 0
    """Stored once by content whatever its size, its payloads a claim (infra/temporal/payload_storage.py): the
    training workflow starts hundreds of units of one task."""

    name: str = Field(min_length=1)
    env: str = Field(min_length=1)
    reward: str | None = Field(
        None,
        min_length=1,
        validate_default=True,
        description="what scores an episode's transcript: a registered reward (`success`) or an import path "
        "(`mypkg.rewards:score`). Required, except for `env: agent` tasks whose program's run() returns the reward: "
        "without one, an episode whose run() returns None fails the job, saying so (never scored 0)",
    )
    env_args: dict[str, Any] = Field(default_factory=dict)
    reward_args: dict[str, Any] = Field(
        default_factory=dict, description="arguments of a reward model's `from_args` (function rewards take none)"
    )
    reward_placement: RewardPlacement = "serverless"
    generate_pool: PoolName = Field(
        Pool.H800.value,
        description="the generation pool its turns go to; `auto`: the one the training workflow plans for it, "
        "from the task's measured tokens and the pools' measured rates (training.placement)",
    )
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    prompt: PromptFormat = Field(default_factory=PromptFormat)
    max_turns: int = Field(8, ge=1, le=1000)
    tool_parser: str | None = Field(
        None,
        min_length=1,
        description="a chat env's native tool calls: the vLLM tool parser that reads them in the model's replies "
        "(`hermes` for Qwen and the tiny-chat model; any name `vllm serve --tool-call-parser` takes). None: replies "
        "are plain assistant messages",
    )
    group_size: int = Field(1, ge=1, le=256)
    weight: float = Field(1.0, gt=0.0)
    rollout_unit: Literal["trajectory", "group"] = Field(
        "trajectory",
        description="multi-turn tasks: `trajectory` runs every episode as its own workflow, advancing on its own; "
        "`group` plays GRPO groups inside one workflow (no child workflow or result signal per episode), as "
        "`group_play` says: in lockstep in one env session, one batched activity per turn (8x fewer activities "
        "for groups of 8; a slow member holds its group back), or free. Single-turn tasks always run as groups. "
        "Chat envs and agent programs play groups free only, which lets a job of them hold more episodes in flight "
        "than the server's pending children (2,000).",
    )
    group_play: GroupPlay = Field(
        "lockstep",
        description="`rollout_unit: group`: `lockstep` plays the members' turns together in one env session (one "
        "generate_batch and one step_group per turn: a turn waits for the slowest member); `free` lets each member "
        "advance on its own, with its own env session and calls, inside the group's one workflow (no child workflow "
        "or result signal per episode). In batch mode groups play in lockstep whatever this says (an agent program's "
        "members play free in any mode).",
    )

    faults: FaultModel | None = Field(None, description="inject env latency and failures (see FaultModel)")
    reset_pool_size: int = Field(
        0,
        ge=0,
        le=64,
        description="pre-reset envs each cpu worker keeps per (env, args, seed): a reset takes a ready one at once; "
        "otherwise it starts max(1, size) resets of the seed at once (hedged), answers with the first to succeed and "
        "keeps the others for the next reset of that seed (the other members of a GRPO group). 0: one reset, no pool.",
    )
    reset_timeout_s: float | None = Field(
        None, gt=0.0, description="per-reset timeout on the worker (default: the env's declared reset_timeout)"
    )
    env_pool: PoolName | None = Field(
        None,
        description="the pool whose workers hold this task's env sessions; filled from the env's "
        "`@env(pool=...)` when the job is resolved, where it is loaded (None: not known there, so cpu)",
    )
    reward_serverless: bool | None = Field(
        None,
        description="whether the reward may run on the serverless pool; filled from its "
        "`@reward(serverless=...)` when the job is resolved, where it is loaded (False: it runs on generate_pool "
        "whatever reward_placement says)",
    )
    reward_pool: PoolName = Field(
        Pool.SERVERLESS.value, description="the reward pool this task's rewards go to when they run serverless"
    )

    @property
    def is_agent(self) -> bool:
        """Whether an agent program plays this task (`env: agent`): its trajectory serves chat turns, no env steps."""
        return self.env == AGENT_ENV

    @property
    def env_queue(self) -> str:
        """The pool whose workers hold this task's env sessions (reset, restore, prompts, check go there)."""
        return self.env_pool or Pool.CPU.value

    @property
    def reward_queue(self) -> str:
        """The task queue the reward activity goes to: `reward_pool` ("serverless"), or the generation pool's
        when colocated or when the reward is declared `serverless=False`."""
        beside_generation = self.reward_placement == "colocated" or self.reward_serverless is False
        return self.generate_pool if beside_generation else self.reward_pool

    @field_validator("reward")
    @classmethod
    def _reward_unless_a_program_returns_it(cls, reward: str | None, info: ValidationInfo) -> str | None:
        env = info.data.get("env")  # absent when env itself is invalid: that error is reported
        if reward is None and env is not None and env != AGENT_ENV:
            raise PydanticCustomError(
                "missing",
                f"Field required: env {env!r} is scored by the task's reward; name one (`reward: success`, or an "
                "import path `mypkg.rewards:score`). Only `env: agent` tasks, whose run() returns the reward, may "
                "leave it out",
            )
        return reward

    @model_validator(mode="after")
    def _agent_members_play_free(self) -> TaskSpec:
        if self.is_agent and self.rollout_unit == "group" and self.group_play != "free":
            raise ValueError(
                "env: agent: each program drives its own episode, so a group's members cannot play in lockstep: "
                "set group_play: free (each member its own program, inside the group's workflow), or rollout_unit: "
                "trajectory (a workflow each)"
            )
        return self

    @model_validator(mode="after")
    def _one_sample_per_turn(self) -> TaskSpec:
        if self.max_turns > 1 and self.sampling.n != 1:
            raise ValueError(
                f"sampling.n is {self.sampling.n}, but a multi-turn task (max_turns {self.max_turns}) samples one "
                "completion per turn: set sampling.n to 1 and use group_size for GRPO groups"
            )
        return self


class TaskEnv(Section):
    """A task's env as the trainer needs it to read actions: its registered name or import path, and its args."""

    env: str = Field(min_length=1)
    env_args: dict[str, Any] = Field(default_factory=dict)
