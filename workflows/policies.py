"""How each kind of activity may fail: timeouts and retry policies, named per kind of work."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from temporalio.common import RetryPolicy

__all__ = ["ActivityPolicy", "CLOSE", "GENERATE", "RESET", "REWARD", "STEP"]

NEVER_RETRY = ("InvalidInput", "UnknownComponent", "EnvBroken", "RequestRejected", "SessionLost")
"""Error types no retry can fix: bad input, unknown names, an env that raised mid-episode, a request the
engine refuses, a session whose worker is gone."""


@dataclass(frozen=True)
class ActivityPolicy:
    """Keyword arguments for `workflow.execute_activity` of one kind of work."""

    start_to_close: timedelta
    retry: RetryPolicy
    schedule_to_close: timedelta | None = None
    heartbeat: timedelta | None = None

    def kwargs(self, timeout_s: float | None = None) -> dict:
        """`timeout_s` overrides start-to-close (an env's own step timeout, say)."""
        return {
            "start_to_close_timeout": self.start_to_close if timeout_s is None else timedelta(seconds=timeout_s),
            "schedule_to_close_timeout": self.schedule_to_close,
            "heartbeat_timeout": self.heartbeat,
            "retry_policy": self.retry,
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
    # retried (EnvBroken); a worker that vanished shows as a timeout and is retried until schedule_to_close.
    start_to_close=timedelta(seconds=60),
    schedule_to_close=timedelta(minutes=3),
    retry=_retry(attempts=3),
)

CLOSE = ActivityPolicy(
    start_to_close=timedelta(seconds=30),
    schedule_to_close=timedelta(minutes=1),
    retry=_retry(attempts=2),
)

GENERATE = ActivityPolicy(
    # Heartbeats detect a dead generation worker in seconds; another worker of the pool retries.
    start_to_close=timedelta(minutes=5),
    heartbeat=timedelta(seconds=20),
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
