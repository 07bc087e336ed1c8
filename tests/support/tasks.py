"""Job pieces many tests build: the default FrozenLake task with overrides, a job on its own task queues."""

from __future__ import annotations

from rollart.spec.config import JobSpec, TaskSpec, resolve_task

__all__ = ["frozenlake_task", "with_queue_prefix"]


def frozenlake_task(**overrides: object) -> TaskSpec:
    """The default multi-turn task, random 4x4 maps, resolved as a loaded job's tasks are (`resolve_task`)."""
    base = {
        "name": "frozenlake",
        "env": "frozenlake",
        "env_args": {"maps": "random", "size": 4},
        "reward": "success",
        "generate_pool": "h800",
        "max_turns": 6,
    }
    return resolve_task(TaskSpec.model_validate({**base, **overrides}))


def with_queue_prefix(job: JobSpec, prefix: str) -> JobSpec:
    """The job with every task queue prefixed, as `temporal: {task_queue_prefix: ...}` in its YAML would."""
    return job.model_copy(update={"temporal": job.temporal.model_copy(update={"task_queue_prefix": prefix})})
