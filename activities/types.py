"""Typed messages of every activity: one input and one result type each, plus the activity names.

Workflows import this module (it holds pydantic models only), never the
activity implementations. New fields get defaults so that running histories
keep decoding.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rollart.infra.config import SamplingParams

__all__ = [
    "ActivityName",
    "CloseInput",
    "Completion",
    "EnvHandle",
    "GenerateInput",
    "GenerateResult",
    "ResetInput",
    "RewardInput",
    "RewardResult",
    "StepInput",
    "StepResult",
    "Transcript",
    "TurnRecord",
    "turn_key",
]


class ActivityName(str, Enum):
    """Activity type names, as registered by workers and called by workflows."""

    RESET = "reset"
    STEP = "step"
    CLOSE = "close"
    GENERATE = "generate"
    REWARD = "reward"


class _Message(BaseModel):
    model_config = ConfigDict(frozen=True)


class ResetInput(_Message):
    """Create an env session for one trajectory."""

    env: str
    env_args: dict[str, Any] = Field(default_factory=dict)
    seed: int
    trajectory_id: str


class EnvHandle(_Message):
    """A live env session: `step`/`close` must go to `queue`, the private queue of the worker holding it."""

    session_id: str
    queue: str
    worker_id: str
    observation: str
    step_timeout_s: float = 30.0


class StepInput(_Message):
    """Apply one action (the model's raw text) to a session."""

    session_id: str
    action: str


class StepResult(_Message):
    """What the env answered: the next observation (= next prompt), its reward, whether the episode ended."""

    observation: str
    reward: float
    done: bool
    info: dict[str, Any] = Field(default_factory=dict)


class CloseInput(_Message):
    """End a session (idempotent: closing an unknown session is fine)."""

    session_id: str


class GenerateInput(_Message):
    """One generation request; bulk output goes to the store under `data_key`."""

    prompt: str
    sampling: SamplingParams
    data_key: str


class Completion(_Message):
    """The compact part of one sampled completion (tokens and logprobs stay in the store)."""

    text: str
    num_tokens: int
    finish_reason: str


class GenerateResult(_Message):
    """Compact result of a generation: the texts, the policy versions used, and where the tokens are."""

    completions: list[Completion]
    prompt_tokens: int
    policy_version: int
    policy_version_end: int
    data_key: str
    worker_id: str = ""


class TurnRecord(_Message):
    """One turn of a trajectory as a reward function sees it."""

    observation: str
    action: str
    env_reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = Field(default_factory=dict)


class Transcript(_Message):
    """The whole episode, the single argument of a reward function."""

    task: str
    seed: int
    turns: list[TurnRecord]
    final_observation: str = ""

    @property
    def env_return(self) -> float:
        """Sum of the env's own step rewards."""
        return sum(t.env_reward for t in self.turns)


class RewardInput(_Message):
    """Score one finished episode with the named reward."""

    reward: str
    transcript: Transcript


class RewardResult(_Message):
    """The training signal (`value`) and whether the episode counts as a success (reported apart)."""

    value: float
    success: bool


def turn_key(job_id: str, trajectory_id: str, turn: int) -> str:
    """Store key of one turn's tokens and logprobs."""
    return f"trajectories/{_key_word(job_id or 'adhoc')}/{_key_word(trajectory_id)}/turn-{turn:03d}"


def _key_word(text: str) -> str:
    """A workflow id made safe as one store-key word (ids may hold any character)."""
    return re.sub(r"[^A-Za-z0-9_.=@-]", "_", text) or "_"
