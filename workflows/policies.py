"""How each kind of activity may fail: timeouts and retry policies, named per kind of work."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from temporalio.common import RetryPolicy

from rollart.contracts.activities import STICKY_START_S
from rollart.contracts.errors import NEVER_RETRY, ErrorType

__all__ = [
    "CHECK",
    "CLOSE",
    "DESCRIBE_CHILDREN",
    "DESCRIBE_QUEUES",
    "GENERATE",
    "MAX_RESTORES",
    "RESET",
    "RESTORE",
    "REWARD",
    "RUN_AGENT",
    "STEP",
    "TRAIN_STEP",
    "ActivityPolicy",
]

STICKY_START = timedelta(seconds=STICKY_START_S)
"""How long a step/close may wait on an env worker's private queue before its worker is taken for dead.

Only that worker polls the queue, so a task not picked up within this time means the worker is gone (or
hopelessly overloaded): the episode then restores its session on another worker. Schedule-to-start
timeouts are never retried by Temporal, so this is also the detection time."""

MAX_RESTORES = 3
"""How many times one episode may move its session to another worker before it ends failed (infra)."""


@dataclass(frozen=True)
class ActivityPolicy:
    """Keyword arguments for `workflow.execute_activity` of one kind of work."""

    start_to_close: timedelta
    retry: RetryPolicy
    schedule_to_close: timedelta | None = None
    heartbeat: timedelta | None = None
    schedule_to_start: timedelta | None = None

    def kwargs(
        self, timeout_s: float | None = None, start_wait_s: float | None = None, heartbeat_s: float | None = None
    ) -> dict:
        """`timeout_s` overrides start-to-close (an env's own step timeout, say), `start_wait_s` schedule-to-start
        (how long the env worker holding a session may leave a call waiting before it is taken for dead),
        `heartbeat_s` the heartbeat timeout (how long a running call's worker may stay silent: `engine.affinity`)."""
        start = self.schedule_to_start if start_wait_s is None else timedelta(seconds=start_wait_s)
        return {
            "start_to_close_timeout": self.start_to_close if timeout_s is None else timedelta(seconds=timeout_s),
            "schedule_to_close_timeout": self.schedule_to_close,
            "heartbeat_timeout": self.heartbeat if heartbeat_s is None else timedelta(seconds=heartbeat_s),
            "retry_policy": self.retry,
            **({"schedule_to_start_timeout": start} if start else {}),
        }


def _retry(attempts: int, first_s: float = 0.2, max_s: float = 5.0) -> RetryPolicy:
    return RetryPolicy(
        initial_interval=timedelta(seconds=first_s),
        maximum_interval=timedelta(seconds=max_s),
        maximum_attempts=attempts,
        non_retryable_error_types=list(NEVER_RETRY),
    )


RESET = ActivityPolicy(
    # A reset may be slow (sandbox start-up); each attempt builds a fresh env, so retrying is safe.
    start_to_close=timedelta(seconds=120),
    schedule_to_close=timedelta(minutes=10),
    retry=_retry(attempts=4),
)

STEP = ActivityPolicy(
    # Sticky: the session lives in one process. An env that raised is half-mutated, so it is not
    # retried (EnvBroken); a transient fault before the env was touched is. A worker that died mid-step
    # shows as a start-to-close timeout, one that is gone as a schedule-to-start timeout on its private
    # queue: either way the episode restores its session elsewhere (`RESTORE`).
    start_to_close=timedelta(seconds=60),
    schedule_to_close=timedelta(minutes=3),
    schedule_to_start=STICKY_START,
    retry=_retry(attempts=3),
)

CHECK = ActivityPolicy(
    # Single-turn answers checked on fresh envs from the shared cpu queue (no session): any worker may retry,
    # so no schedule-to-start limit — a busy shared queue is not a dead worker.
    start_to_close=timedelta(seconds=60),
    schedule_to_close=timedelta(minutes=3),
    retry=_retry(attempts=3),
)

CLOSE = ActivityPolicy(
    start_to_close=timedelta(seconds=30),
    schedule_to_close=timedelta(minutes=1),
    schedule_to_start=STICKY_START,
    retry=_retry(attempts=2),
)

RESTORE = ActivityPolicy(
    # Rebuild a lost session on any live env worker: reset from the seed, replay the recorded actions.
    # Retried like a reset (each attempt starts from scratch); a replay that diverges is not retried.
    start_to_close=timedelta(seconds=180),
    schedule_to_close=timedelta(minutes=10),
    retry=_retry(attempts=4),
)

GENERATE = ActivityPolicy(
    # Heartbeats detect a dead generation worker within a minute (a job's `engine.affinity.heartbeat_s`); another
    # worker of the pool retries. Sized to an agentic turn (tens of seconds), not to seconds: each heartbeat the SDK
    # sends is a billed action, and the SDK sends at most one per 0.8 x this timeout. The engine beats every third of
    # it (activities/generate.py): a turn of 30 s beats once, one of 120 s 3 times.
    start_to_close=timedelta(minutes=5),
    heartbeat=timedelta(seconds=60),
    schedule_to_close=timedelta(minutes=30),
    retry=_retry(attempts=5, first_s=0.5, max_s=10.0),
)

REWARD = ActivityPolicy(
    # Stateless: any worker of the pool may retry it. Heartbeats (every 2 s while scoring) notice a
    # worker that died mid-call in 10 s, e.g. one the autoscaler lost, and another worker retries.
    start_to_close=timedelta(seconds=60),
    heartbeat=timedelta(seconds=10),
    schedule_to_close=timedelta(minutes=10),
    retry=_retry(attempts=3),
)

TRAIN_STEP = ActivityPolicy(
    # One step at a time on the trainer's process; it heartbeats every 5 s, so a killed trainer is
    # noticed in 20 s and a replacement retries the (idempotent) step from the last checkpoint, as often
    # as it takes. A step whose own code raised fails at once (TrainStepFailed): it would raise again.
    start_to_close=timedelta(minutes=30),
    heartbeat=timedelta(seconds=20),
    retry=RetryPolicy(
        initial_interval=timedelta(seconds=1),
        maximum_interval=timedelta(seconds=10),
        non_retryable_error_types=[ErrorType.INVALID_INPUT.value, ErrorType.TRAIN_STEP_FAILED.value],
    ),
)

RUN_AGENT = ActivityPolicy(
    # A user's agent program, run once: a second run would replay its chat turns into a conversation that has moved
    # on, so it is never retried; the activity enforces the program's own timeout (the caller's `timeout_s` is a
    # backstop above it), and heartbeats notice a worker that died under it. Either way the trajectory fails (masked).
    start_to_close=timedelta(minutes=10),
    heartbeat=timedelta(seconds=30),
    retry=RetryPolicy(maximum_attempts=1),
)

DESCRIBE_QUEUES = ActivityPolicy(
    # The training workflow's stall check: a few DescribeTaskQueue calls on the control worker. A check that
    # fails is skipped (the next one comes `check_every_s` later), never waited on. A single-turn wave's
    # `live_engines` (one ListWorkers call) fails the same way: the wave then goes whole to the shared queue.
    start_to_close=timedelta(seconds=10),
    schedule_to_close=timedelta(seconds=20),
    retry=_retry(attempts=2, first_s=1.0),
)

DESCRIBE_CHILDREN = ActivityPolicy(
    # After a continue-as-new: which units started by an earlier run have closed (one DescribeWorkflowExecution
    # each, and the result of those that did, on the control worker). A check that fails is skipped: the next
    # comes `stall.check_every_s` later, and nothing waits on it.
    start_to_close=timedelta(seconds=60),
    schedule_to_close=timedelta(seconds=120),
    retry=_retry(attempts=2, first_s=1.0),
)
