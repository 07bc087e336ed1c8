"""What `rollart show` and the report print about one trajectory: its turns, the activity calls that made them.

A trajectory is recorded in three places: its workflow's result (`TrajectoryResult`: status, reward, versions,
turn keys), its workflow's history (every activity's input and result, the worker that ran it and when) and the
payload store (`StoredTurn` under each turn key: token ids and behaviour logprobs). A TrajectoryWorkflow holds one
trajectory (its id is the workflow id); a GroupRolloutWorkflow or BatchRolloutWorkflow holds several, named
`<workflow id>-<n>`. `trajectory_loader` reads one into these types; `job_trajectories` lists a job's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rollart.contracts.rollouts import TrajectoryResult
from rollart.infra.temporal.history import ActivitySpan

__all__ = ["ROLLOUT_WORKFLOWS", "CallInfo", "LogprobSummary", "TrajectoryView", "TurnView", "summarize_logprobs"]

# The workflow types that hold trajectories: where both reading one and listing a job's look.
ROLLOUT_WORKFLOWS = ("TrajectoryWorkflow", "GroupRolloutWorkflow", "BatchRolloutWorkflow")


@dataclass(frozen=True)
class CallInfo:
    """One activity as the history saw it: which worker ran it, how long it waited and ran."""

    activity: str
    worker: str
    queue: str
    wait_s: float  # scheduled → started (its last attempt)
    run_s: float  # started → completed or failed
    succeeded: bool

    @classmethod
    def of(cls, span: ActivitySpan) -> CallInfo:
        run = span.completed - span.started if span.started and span.completed else 0.0
        wait = span.started - span.scheduled if span.started else 0.0
        return cls(span.activity_type, span.worker_identity, span.task_queue, wait, run, span.succeeded)


@dataclass(frozen=True)
class LogprobSummary:
    """The behaviour logprobs of one completion, in a few numbers."""

    n: int
    total: float
    mean: float
    min: float

    @property
    def perplexity(self) -> float:
        return math.exp(-self.mean) if self.n else float("nan")


def summarize_logprobs(logprobs: list[float]) -> LogprobSummary | None:
    """n, sum, mean and min of a completion's token logprobs; None when there are none."""
    if not logprobs:
        return None
    total = sum(logprobs)
    return LogprobSummary(n=len(logprobs), total=total, mean=total / len(logprobs), min=min(logprobs))


@dataclass(frozen=True)
class TurnView:
    """One turn: what the model saw and did, what the env answered, and the calls that made it."""

    index: int
    observation: str
    action: str
    data_key: str = ""
    env_reward: float | None = None
    done: bool | None = None
    info: dict[str, Any] = field(default_factory=dict)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    policy_version: int | None = None
    policy_version_end: int | None = None
    logprobs: LogprobSummary | None = None
    generate: CallInfo | None = None
    step: CallInfo | None = None
    store_note: str | None = None  # why the store had nothing for this turn


@dataclass(frozen=True)
class TrajectoryView:
    """A trajectory as `rollart show` prints it."""

    trajectory_id: str
    workflow_id: str
    run_id: str
    workflow_type: str
    workflow_status: str
    result: TrajectoryResult | None
    turns: list[TurnView]
    final_observation: str = ""
    error: str | None = None
    calls: list[CallInfo] = field(default_factory=list)  # every activity of the trajectory's workflow

    @property
    def versions(self) -> str:
        vs = [v for t in self.turns for v in (t.policy_version, t.policy_version_end) if v is not None]
        return f"v{min(vs)}..v{max(vs)}" if vs else "-"
