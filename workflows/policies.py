"""How each kind of activity may fail: timeouts and retry policies, named per kind of work."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from temporalio.common import RetryPolicy

__all__ = ["ActivityPolicy", "CLOSE", "GENERATE", "RESET", "REWARD", "STEP"]


@dataclass(frozen=True)
class ActivityPolicy:
    """Keyword arguments for `workflow.execute_activity` of one kind of work."""

    start_to_close: timedelta
    retry: RetryPolicy
    schedule_to_close: timedelta | None = None
    heartbeat: timedelta | None = None

    def kwargs(self) -> dict:
        return {
            "start_to_close_timeout": self.start_to_close,
            "schedule_to_close_timeout": self.schedule_to_close,
            "heartbeat_timeout": self.heartbeat,
            "retry_policy": self.retry,
        }


_NEVER_RETRY = ("InvalidInput", "UnknownComponent", "EnvBroken")
"""Error types that no retry can fix: bad input, unknown names, an env that raised mid-episode."""

RESET = ActivityPolicy(
    # A reset may be slow (sandbox start-up); a fresh env each attempt, so retrying is safe.
    start_to_close=timedelta(seconds=120),
    schedule_to_close=timedelta(minutes=10),
    retry=RetryPolicy(
        initial_interval=timedelta(milliseconds=200),
        maximum_interval=timedelta(seconds=5),
        maximum_attempts=4,
        non_retryable_error_types=list(_NEVER_RETRY),
    ),
)

STEP = ActivityPolicy(
    # Sticky: the session lives in one process. An env that raised is half-mutated, so it is not
    # retried; a worker that vanished shows as a timeout and is retried until schedule_to_close.
    start_to_close=timedelta(seconds=60),
    schedule_to_close=timedelta(minutes=3),
    retry=RetryPolicy(
        initial_interval=timedelta(milliseconds=200),
        maximum_interval=timedelta(seconds=5),
        maximum_attempts=3,
        non_retryable_error_types=list(_NEVER_RETRY),
    ),
)

CLOSE = ActivityPolicy(
    start_to_close=timedelta(seconds=30),
    schedule_to_close=timedelta(minutes=1),
    retry=RetryPolicy(maximum_attempts=2, non_retryable_error_types=list(_NEVER_RETRY)),
)

GENERATE = ActivityPolicy(
    # Heartbeats detect a dead generation worker in seconds; another worker of the pool retries.
    start_to_close=timedelta(minutes=5),
    heartbeat=timedelta(seconds=20),
    schedule_to_close=timedelta(minutes=30),
    retry=RetryPolicy(
        initial_interval=timedelta(milliseconds=500),
        maximum_interval=timedelta(seconds=10),
        maximum_attempts=5,
        non_retryable_error_types=list(_NEVER_RETRY),
    ),
)

REWARD = ActivityPolicy(
    # Stateless: any worker of the pool may retry it.
    start_to_close=timedelta(seconds=60),
    schedule_to_close=timedelta(minutes=10),
    retry=RetryPolicy(
        initial_interval=timedelta(milliseconds=200),
        maximum_interval=timedelta(seconds=5),
        maximum_attempts=3,
        non_retryable_error_types=list(_NEVER_RETRY),
    ),
)
