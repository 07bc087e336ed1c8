"""The third level of a job's validation: every env and reward it names can be built with its args.

The first level is the spec's shape (pydantic, `spec/config/`), the second its cross-field rules and the env's and
reward's declarations of where they run (`resolve`, at load). This one imports the user's code: it builds each env
once with its env_args (and each env server's), checks each reward's reward_args, and checks that an env fits its
task (a chat env needs a multi-turn trajectory task; entropy over actions needs an env that declares them). The CLI
runs it before any workflow starts (`rollart check`, `rollart train`), so a typo fails in a second, not on a worker.
"""

from __future__ import annotations

from rollart.spec.config import JobSpec, TaskSpec
from rollart.spec.config.agent import AgentArgs
from rollart.spec.env import ChatEnv, declares_actions
from rollart.spec.registry import lookup_env, lookup_reward

__all__ = ["JobCheckError", "check_job_components"]


class JobCheckError(ValueError):
    """A job names an env or reward that cannot be used; raised before any workflow starts."""


def check_job_components(job: JobSpec) -> None:
    """Resolve every task's env and reward, build each env once with its env_args (and each env server's), check
    the reward_args; an agent program's env_args are checked as such (`env: agent`: no env class)."""
    problems = []
    for i, task in enumerate(job.tasks):
        problems += [f"tasks.{i} ({task.name}): {p}" for p in _env_problems(job, task)]
        try:
            entry = lookup_reward(task.reward)
            entry.check_args(task.reward_args)
        except Exception as e:
            problems.append(f"tasks.{i} ({task.name}): reward: {e}")
    for i, server in enumerate(job.env_servers):
        try:
            lookup_env(server.env).cls(**server.env_args)
        except Exception as e:
            problems.append(f"env_servers.{i} ({server.name}): env: {e}")
    if problems:
        raise JobCheckError("job cannot run:\n  " + "\n  ".join(problems))


def _env_problems(job: JobSpec, task: TaskSpec) -> list[str]:
    """What is wrong with a task's env: not found, refusing its args, or unfit for the task."""
    if task.is_agent:
        try:
            AgentArgs.parse(task.env_args)
        except ValueError as e:
            return [f"env_args: {e}"]
        return []
    try:
        entry = lookup_env(task.env)
        entry.cls(**task.env_args)
    except Exception as e:
        return [f"env: {e}"]
    problems = []
    if job.trainer.loss.entropy_over == "actions" and not declares_actions(entry.cls):
        problems.append(
            "trainer.loss.entropy_over: actions needs an env that "
            f"declares its actions (Env.action_of); env {task.env!r} does not"
        )
    if issubclass(entry.cls, ChatEnv):
        problems += _chat_env_problems(job, task)
    return problems


def _chat_env_problems(job: JobSpec, task: TaskSpec) -> list[str]:
    """A chat env's episode grows a conversation token by token, each its own: it plays as a trajectory or as a free
    member of its group, never in lockstep with others (a lockstep turn is one batched text prompt each)."""
    if task.max_turns == 1:
        return [
            f"env {task.env!r} is a chat env, whose episodes are conversations: set max_turns above 1 (a one-turn "
            "chat task ends on its first step)"
        ]
    if task.rollout_unit != "group":
        return []
    if task.group_play != "free":
        return [
            f"env {task.env!r} is a chat env, whose members cannot play in lockstep (one batched text prompt a "
            "turn): set group_play: free (each member its own session, inside the group's workflow), or "
            "rollout_unit: trajectory"
        ]
    if job.training.rollout_mode == "batch":
        return [
            f"env {task.env!r} is a chat env, and batch mode plays groups in lockstep: set rollout_unit: "
            "trajectory for the synchronous baseline"
        ]
    return []
