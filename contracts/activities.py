"""Typed messages of the activities: one input and one result type each, plus the activity names. Generation's
(requests, results, what an engine reports of itself) are in contracts/generation.py.

Workflows import this module (it holds pydantic models only), never the
activity implementations. New fields get defaults so that running histories
keep decoding.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from rollart.contracts.errors import ErrorType
from rollart.contracts.ids import TurnKeys
from rollart.infra.store.keys import key_word
from rollart.spec.chat import ChatMessage
from rollart.spec.config import FaultModel, TaskSpec, TrainerConfig, WeightsConfig

__all__ = [
    "BULK_CLAIM_BYTES",
    "STICKY_START_S",
    "ActivityName",
    "CheckInput",
    "CloseInput",
    "DescribeQueuesInput",
    "DescribeQueuesResult",
    "EnvHandle",
    "EnvOptions",
    "GroupHandle",
    "GroupResetInput",
    "GroupStepInput",
    "PromptsInput",
    "QueueState",
    "ResetInput",
    "RestoreInput",
    "RewardBatchInput",
    "RewardInput",
    "RewardResult",
    "SampleRef",
    "StepInput",
    "StepResult",
    "TrainStepInput",
    "TrainStepResult",
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
    REWARD_BATCH = "reward_batch"
    PROMPTS = "prompts"
    CHECK = "check"
    RESET_GROUP = "reset_group"
    STEP_GROUP = "step_group"
    GENERATE_BATCH = "generate_batch"
    TRAIN_STEP = "train_step"
    RESTORE = "restore"
    DESCRIBE_QUEUES = "describe_queues"
    DESCRIBE_CHILDREN = "describe_children"
    LIVE_ENGINES = "live_engines"
    RUN_AGENT = "run_agent"


class _Message(BaseModel):
    model_config = ConfigDict(frozen=True)


class EnvOptions(_Message):
    """How a task's envs are run on the cpu workers: injected faults, the pre-reset pool, the reset timeout."""

    faults: FaultModel | None = None
    reset_pool_size: int = Field(0, ge=0)
    reset_timeout_s: float | None = Field(None, gt=0.0)

    @classmethod
    def of(cls, task: TaskSpec) -> EnvOptions | None:
        """The task's options, or None when it uses none (old inputs carry none either)."""
        if task.faults is None and task.reset_pool_size == 0 and task.reset_timeout_s is None:
            return None
        return cls(faults=task.faults, reset_pool_size=task.reset_pool_size, reset_timeout_s=task.reset_timeout_s)


class ResetInput(_Message):
    """Create an env session for one trajectory."""

    env: str
    env_args: dict[str, Any] = Field(default_factory=dict)
    seed: int
    trajectory_id: str
    options: EnvOptions | None = None


class RestoreInput(_Message):
    """Re-create a lost session on this worker: reset from `seed`, replay each member's recorded actions.

    `actions[i]` are member i's actions so far and `observations[i]` the observation it last saw;
    a replay that does not end on that observation means the env is not deterministic (fails, not retried).
    One member for a trajectory, `group_size` for a lockstep group.
    """

    env: str
    env_args: dict[str, Any] = Field(default_factory=dict)
    seed: int
    owner_id: str
    actions: list[list[str]] = Field(min_length=1)
    observations: list[str] = Field(min_length=1)
    options: EnvOptions | None = None
    messages: list[list[ChatMessage]] | None = None
    """A chat env's actions as the assistant messages it was given (`messages[i][k]` for `actions[i][k]`)."""


STICKY_START_S = 10.0
"""How long a step/close may wait on an env worker's private queue before that worker is taken for dead (and the
session restored elsewhere), unless its handle says otherwise."""


class EnvHandle(_Message):
    """A live env session: `step`/`close` must go to `queue`, the private queue of the worker holding it."""

    session_id: str
    queue: str
    worker_id: str
    observation: str
    step_timeout_s: float = 30.0
    sticky_start_s: float = Field(STICKY_START_S, gt=0.0)
    messages: list[ChatMessage] | None = None
    """A chat env's opening messages (`observation` is then their text); None for a text env."""
    tools: list[dict[str, Any]] | None = None
    """A chat env's tools, as JSON schemas (OpenAI's function-tool shape)."""


class StepInput(_Message):
    """Apply one action to a session: the model's raw text, and for a chat env the assistant message it parsed to."""

    session_id: str
    action: str
    message: ChatMessage | None = None


class StepResult(_Message):
    """What the env answered: the next observation (= next prompt), its reward, whether the episode ended.

    A chat env answers with new `messages` (tool outputs, a user's reply) that continue the conversation;
    `observation` is then their text.
    """

    observation: str
    reward: float
    done: bool
    info: dict[str, Any] = Field(default_factory=dict)
    messages: list[ChatMessage] | None = None


class CloseInput(_Message):
    """End a session (idempotent: closing an unknown session is fine)."""

    session_id: str


class GroupResetInput(_Message):
    """Create one env session holding `size` copies of an env, all reset from the same seed (a GRPO group)."""

    env: str
    env_args: dict[str, Any] = Field(default_factory=dict)
    seed: int
    size: int = Field(ge=1)
    group_id: str
    options: EnvOptions | None = None


class GroupHandle(_Message):
    """A live group session: member i starts from `observations[i]`; `step_group`/`close` go to `queue`."""

    session_id: str
    queue: str
    worker_id: str
    observations: list[str]
    step_timeout_s: float = 30.0
    sticky_start_s: float = Field(STICKY_START_S, gt=0.0)


class GroupStepInput(_Message):
    """One turn of a group: `actions[i]` is member i's text, None for a member whose episode is over."""

    session_id: str
    actions: list[str | None]


class TurnRecord(_Message):
    """One turn of a trajectory as a reward function sees it."""

    observation: str
    action: str
    env_reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = Field(default_factory=dict)
    message: ChatMessage | None = None
    """A chat env's turn: the assistant message the env was given (tool calls parsed); None for a text env."""


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
    """Score one finished episode with the named reward (`reward_args`: a reward model's settings)."""

    reward: str
    transcript: Transcript
    reward_args: dict[str, Any] = Field(default_factory=dict)


class PromptsInput(_Message):
    """Single-turn tasks: the first observation of the env for each seed (no session is kept)."""

    env: str
    env_args: dict[str, Any] = Field(default_factory=dict)
    seeds: list[int]


class CheckInput(_Message):
    """Single-turn tasks: play each answer as the one step of a fresh env reset from its seed."""

    env: str
    env_args: dict[str, Any] = Field(default_factory=dict)
    seeds: list[int]
    answers: list[list[str]]  # answers[i]: the completions sampled for seeds[i]


class RewardBatchInput(_Message):
    """Score many finished episodes with the named reward in one call."""

    reward: str
    transcripts: list[Transcript]
    reward_args: dict[str, Any] = Field(default_factory=dict)


class RewardResult(_Message):
    """The training signal (`value`) and whether the episode counts as a success (reported apart)."""

    value: float
    success: bool

    @classmethod
    def of(cls, value: object, reward: str) -> RewardResult:
        """What a reward function returned, as a result: a `RewardResult`, or a plain number (a number r counts as
        a success when r ≥ 1). Anything else, or a value that is not finite, is the reward's bug: InvalidInput."""
        if isinstance(value, RewardResult):
            result = value
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            result = cls(value=float(value), success=float(value) >= 1.0)
        else:
            raise ErrorType.INVALID_INPUT.error(
                f"reward {reward!r} returned {value!r}; return a float or a RewardResult"
            )
        if not math.isfinite(result.value):
            raise ErrorType.INVALID_INPUT.error(f"reward {reward!r} returned {result.value}")
        return result


class SampleRef(_Message):
    """One finished trajectory as training sees it: its reward, its GRPO group and where its tokens are."""

    trajectory_id: str
    task: str
    group_id: str
    reward: float
    success: bool
    turn_keys: TurnKeys
    policy_version_min: int
    policy_version_max: int
    completion_tokens: int = 0
    completion_index: int = 0  # which of each turn record's completions is this sample's (n > 1 groups)
    prompt_tokens: int = 0
    uncached_prompt_tokens: int | None = None  # what a prefix cache would not hold (None: recorded before it was)


BULK_CLAIM_BYTES = 8 * 1024
"""Where a bulk input (a train step's, the training workflow's) goes to the store by its `claim_over_bytes`
(infra/temporal/payload_storage.py): a small job's stays readable in the UI (a plan is 2.5–3 KB), a large job's
samples and carried state stay out of the parent's history."""


class TrainStepInput(_Message):
    """Train step `step` of a job: updates policy version `step` to `step + 1` and publishes it.

    Idempotent: a step the trainer already ran returns its recorded result. A large one (its samples) goes to
    the store, its history event a claim (`BULK_CLAIM_BYTES`).
    """

    claim_over_bytes: ClassVar[int] = BULK_CLAIM_BYTES

    job_id: str
    step: int = Field(ge=0)
    samples: list[SampleRef]
    model_dir: str
    run_dir: str
    trainer: TrainerConfig
    weights: WeightsConfig = Field(default_factory=WeightsConfig)


class TrainStepResult(_Message):
    """What one step did: the version it published and its metrics (loss, KL, entropy, clip fraction, ...)."""

    step: int
    version: int
    weights_key: str
    """Where the version was published: full weights (`weights/<job>/v….safetensors`), or with `trainer.lora` the
    adapter's weights file (`adapters/<job>/v…/adapter_model.safetensors`, beside its config)."""
    metrics: dict[str, float] = Field(default_factory=dict)
    replayed: bool = False


class DescribeQueuesInput(_Message):
    """The activity queues whose backlog and pollers the training workflow watches for stalls."""

    queues: list[str] = Field(min_length=1)


class QueueState(_Message):
    """One queue as Temporal describes it: tasks waiting, how long the oldest has waited, who serves it.

    `workers` counts the workers whose heartbeats are current (None: the server keeps no heartbeats);
    `last_seen_s_ago` is the time since the newest sign of any worker, a heartbeat or a poll (None: no
    worker ever seen). Descriptions recorded before these two existed carry neither.
    """

    queue: str
    backlog: int
    backlog_age_s: float = 0.0
    pollers: int = 0
    workers: int | None = None
    last_seen_s_ago: float | None = None


class DescribeQueuesResult(_Message):
    """Every asked-for queue, in the order asked."""

    queues: list[QueueState] = Field(default_factory=list)


def turn_key(job_id: str, trajectory_id: str, turn: int) -> str:
    """Store key of one turn's tokens and logprobs."""
    return f"trajectories/{key_word(job_id or 'adhoc')}/{key_word(trajectory_id)}/turn-{turn:03d}"
