"""The resolve step: what a job spec cannot know by itself, read where the job is loaded.

Validating a spec (`JobSpec.model_validate`) is pure: it reads the data and imports none of the user's modules.
`resolve` is the one place that does, explicitly: it looks each task's env and reward up in the registry, fills
in where they declare they run (`env_pool` from `@env(pool=...)`, `reward_serverless` from
`@reward(serverless=...)`), and checks the rules that depend on that (every pool the job routes work to has
workers). `load_job` calls it, and so does each client that turns a job made in code into the plan the workflows
get (`start_training`); workflow code never does: the plan it gets carries the result as data.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from rollart.spec.config.job import JobSpec
from rollart.spec.config.pools import check_rewards_have_workers, check_routes
from rollart.spec.config.task import TaskSpec
from rollart.spec.registry import declared_env_pool, declared_reward_serverless

__all__ = ["check_placement", "resolve", "resolve_task"]


def resolve_task(task: TaskSpec) -> TaskSpec:
    """`task` with `env_pool` and `reward_serverless` filled from its env's and reward's declarations.

    What the task already says is kept, so resolving twice changes nothing. A declaration that cannot be read in
    this process (an env only the workers can import) leaves the field None: the default placement.
    """
    filled: dict[str, Any] = {}
    if task.env_pool is None:
        filled["env_pool"] = declared_env_pool(task.env)
    if task.reward_serverless is None and task.reward is not None:
        filled["reward_serverless"] = declared_reward_serverless(task.reward)
    return task.model_copy(update=filled) if filled else task


def check_placement(job: JobSpec) -> None:
    """The rules on where a job's work goes: every pool its tasks' envs, generation and rewards are routed to has
    workers (in its `kubernetes` layout, and for rewards on an elastic pool, in `pools`). A ValueError says which.

    Where a task's env and reward run is known once the job is resolved, so this runs in `resolve`.
    """
    problems = job.kubernetes.problems(job.needs()) if job.kubernetes is not None else []
    if problems:
        raise ValueError("kubernetes: " + "; ".join(problems))
    check_routes(job.tasks, job.pools)  # again: env_pool is now what the envs declare
    check_rewards_have_workers(job.tasks, job.pools)


def resolve(job: JobSpec) -> JobSpec:
    """`job` with every task's declared placement filled in (`resolve_task`), checked by `check_placement`.

    A rule broken is a pydantic ValidationError at the top level, as if the spec itself had not validated, so
    callers report it as they report the spec's other errors (`format_validation_error`).
    """
    resolved = job.model_copy(update={"tasks": [resolve_task(t) for t in job.tasks]})
    try:
        check_placement(resolved)
    except ValueError as e:
        raw = job.model_dump(mode="json", exclude_unset=True)
        raise ValidationError.from_exception_data(
            type(job).__name__, [{"type": "value_error", "loc": (), "input": raw, "ctx": {"error": e}}]
        ) from e
    return resolved
