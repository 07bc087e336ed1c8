"""Inputs and results of the workflows: what a user (or `temporal workflow start`) sends, what comes back."""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from rollart.contracts.generation import EnginePressure
from rollart.contracts.ids import TurnKeys, member_id
from rollart.spec.config import AffinityConfig, GroupPlay, PriorityPolicy, TaskSpec
from rollart.spec.pools import QUEUE_PREFIX_PATTERN

__all__ = [
    "BatchRolloutInput",
    "ChildOutcome",
    "DescribeChildrenInput",
    "DescribeChildrenResult",
    "GroupRolloutArgs",
    "GroupRolloutInput",
    "GroupSeed",
    "TrajectoryArgs",
    "TrajectoryInput",
    "TrajectoryResult",
    "TrajectoryStatus",
]

TrajectoryStatus = Literal["completed", "failed"]

Args = TypeVar("Args", bound=BaseModel)
Whole = TypeVar("Whole", bound=BaseModel)


def _fields(model: BaseModel, of: type[BaseModel]) -> dict[str, Any]:
    return {k: getattr(model, k) for k in of.model_fields}


def joined(args_type: type[Args], whole_type: type[Whole], args: Any, task: TaskSpec | None) -> Whole:
    """A unit's workflow arguments as one input: the args and the task a training workflow sends apart, or the
    whole input a client sends alone. Alone it arrives as a dict (the SDK decodes arguments by their type hints
    only when as many come as the signature has), validated here: bad input is a pydantic ValidationError."""
    if isinstance(args, dict):
        args = (whole_type if "task" in args else args_type).model_validate(args)
    if isinstance(args, whole_type):
        return args
    return whole_type(**_fields(args, args_type), task=task)


class TrajectoryArgs(BaseModel):
    """A `TrajectoryInput` without its task: how the training workflow starts a trajectory. The task goes as the
    workflow's second argument, which the data converter stores once by content (infra/temporal/payload_storage.py):
    the parent's history holds a claim for it, not a copy per trajectory (issue 48)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(ge=0)
    job_id: str = ""
    group_id: str = ""
    min_version: int = Field(0, ge=0, description="generate with at least this policy version")
    report_to: str | None = Field(None, description="workflow id to signal `trajectories_done` with the result")
    trajectory_id: str = Field("", description="set by the parent for a lockstep batch's members; else the workflow id")
    queue_prefix: str = Field("", pattern=QUEUE_PREFIX_PATTERN, description="the job's task-queue prefix")
    affinity: AffinityConfig = Field(
        default_factory=AffinityConfig, description="which engine serves its turns (the job's engine.affinity)"
    )
    priority: PriorityPolicy = Field("fifo", description="how its requests rank on the engine (engine.priority)")
    predicted_turns: float | None = Field(
        None, description="its predicted length in turns (engine.priority: predicted; None: not predicted)"
    )

    @staticmethod
    def whole(args: TrajectoryArgs | dict[str, Any], task: TaskSpec | None) -> TrajectoryInput:
        """The workflow's arguments as one input (`joined`)."""
        return joined(TrajectoryArgs, TrajectoryInput, args, task)

    def with_task(self, task: TaskSpec | None) -> TrajectoryInput:
        """The whole input (a pydantic ValidationError without a task: the workflow fails on bad input)."""
        return joined(TrajectoryArgs, TrajectoryInput, self, task)


class TrajectoryInput(TrajectoryArgs):
    """One episode of one task from one seed. Unknown fields are rejected (a typo fails at once)."""

    task: TaskSpec

    def split(self) -> tuple[TrajectoryArgs, TaskSpec]:
        """The arguments a child is started with: the rest, and the task (stored once, by content)."""
        return TrajectoryArgs(**_fields(self, TrajectoryArgs)), self.task


class TrajectoryResult(BaseModel):
    """The compact outcome; tokens, logprobs and texts of each turn are in the store under `turn_keys`.

    `status == "failed"` means the episode could not be run (an env that raised, a worker that never
    answered): `reward` is then None — a failed trajectory is never scored 0.
    """

    model_config = ConfigDict(frozen=True)

    trajectory_id: str
    task: str
    seed: int
    status: TrajectoryStatus
    group_id: str = ""
    reward: float | None = None
    success: bool | None = None
    turns: int = 0
    policy_version_min: int | None = None
    policy_version_max: int | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    uncached_prompt_tokens: int | None = None  # prompt tokens a prefix cache would not hold: new since the turn before
    turn_keys: TurnKeys = Field(default_factory=list)
    completion_index: int = 0  # single-turn groups: which completion of the group's generation is this one
    env_worker: str | None = None
    error: str | None = None
    error_type: str | None = None  # a failure no retry can cure (an ErrorType value): training.fail_after_failures
    restores: int = 0  # times the env session moved to another worker (its worker died): replayed, not lost
    engine_worker: str | None = None  # the generation worker of its last turn
    engine_pool: str | None = None  # the generation pool its turns went to (where `generate_pool: auto` put it)
    engine_moves: int = 0  # turns served by another engine than the turn before (gone, busy, or no affinity)
    pressure: EnginePressure | None = None  # its last turn's engine, as it reported then (admission reads it)


class GroupSeed(BaseModel):
    """One GRPO group: its id, the env seed all its members share, and the members' trajectory ids.

    The parent names the members (`member_ids`); histories from before it did carry none, and then
    the members are `member_id(group_id, m)`, as the parent always named them.
    """

    group_id: str
    seed: int = Field(ge=0)
    member_ids: list[str] = Field(default_factory=list)

    def members(self, size: int) -> list[str]:
        """The trajectory ids of the group's `size` members."""
        return list(self.member_ids) or [member_id(self.group_id, m) for m in range(size)]


class GroupRolloutArgs(BaseModel):
    """A `GroupRolloutInput` without its task, which goes as the second argument (stored once: see `TrajectoryArgs`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    groups: list[GroupSeed] = Field(min_length=1)
    job_id: str = ""
    min_version: int = Field(0, ge=0)
    report_to: str | None = None
    queue_prefix: str = Field("", pattern=QUEUE_PREFIX_PATTERN)
    affinity: AffinityConfig = Field(default_factory=AffinityConfig)
    """Which engine serves each group's turns, and whether a single-turn wave splits across engines."""
    priority: PriorityPolicy = "fifo"
    """How the groups' requests rank among those waiting on an engine (the job's `engine.priority`)."""
    predicted_turns: float | None = None
    """The task's recent mean length in turns (`engine.priority: predicted`), until a member finishes."""
    lockstep: bool = False
    """Multi-turn: all groups phase by phase (every reset, then every turn's generations, then steps, then every
    reward), the synchronous baseline's barrier at group granularity; False: each group on its own."""
    group_play: GroupPlay = "lockstep"
    """Multi-turn, not `lockstep`: the members' turns together in one env session, or each member on its own (the
    task's `group_play`). Its default is what histories recorded before the field replay as."""

    @staticmethod
    def whole(args: GroupRolloutArgs | dict[str, Any], task: TaskSpec | None) -> GroupRolloutInput:
        """The workflow's arguments as one input (`joined`)."""
        return joined(GroupRolloutArgs, GroupRolloutInput, args, task)

    def with_task(self, task: TaskSpec | None) -> GroupRolloutInput:
        """The whole input (a pydantic ValidationError without a task: the workflow fails on bad input)."""
        return joined(GroupRolloutArgs, GroupRolloutInput, self, task)


class GroupRolloutInput(GroupRolloutArgs):
    """GRPO groups of one task, rolled out group by group; each member reports under its id in `GroupSeed.members`."""

    task: TaskSpec

    def split(self) -> tuple[GroupRolloutArgs, TaskSpec]:
        """The arguments a child is started with: the rest, and the task (stored once, by content)."""
        return GroupRolloutArgs(**_fields(self, GroupRolloutArgs)), self.task


class BatchRolloutInput(BaseModel):
    """The episodes of one lockstep batch; each result is reported to `report_to` at the end."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trajectories: list[TrajectoryInput] = Field(min_length=1)
    report_to: str | None = None


class DescribeChildrenInput(BaseModel):
    """Units' workflows started by an earlier run of the training workflow, to tell which of them have closed."""

    workflow_ids: list[str]


class ChildOutcome(BaseModel):
    """A unit's workflow that has closed: its results when it completed, else why it did not."""

    workflow_id: str
    status: str  # completed, failed, timed_out, terminated, canceled, not_found
    results: list[TrajectoryResult] = Field(default_factory=list)
    error: str | None = None
    error_type: str | None = None  # the cause's type when no retry can cure it


class DescribeChildrenResult(BaseModel):
    """The asked-for workflows that have closed (those still running are left out)."""

    closed: list[ChildOutcome] = Field(default_factory=list)
