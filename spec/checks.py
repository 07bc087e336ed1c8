"""The third level of a job's validation: every env and reward it names can be built with its args.

The first level is the spec's shape (pydantic, `spec/config/`), the second its cross-field rules and the env's and
reward's declarations of where they run (`resolve`, at load). This one imports the user's code: it builds each env
once with its env_args (and each env server's), checks each reward's reward_args, and checks that an env fits its
task (a chat env needs a multi-turn trajectory task; entropy over actions needs an env that declares them) and its
model (a chat env or an agent program needs a chat template). The CLI runs it before any workflow starts (`rollart
check`, `rollart train`), so a typo fails in a second, not on a worker.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from rollart.spec.config import JobSpec, TaskSpec
from rollart.spec.config.agent import AgentArgs
from rollart.spec.env import ChatEnv, declares_actions
from rollart.spec.imports import resolve_import_path
from rollart.spec.registry import lookup_env, lookup_reward

__all__ = ["JobCheckError", "check_job_components", "model_has_chat_template", "needs_chat_template"]


class JobCheckError(ValueError):
    """A job names an env or reward that cannot be used; raised before any workflow starts."""


def check_job_components(job: JobSpec) -> None:
    """Resolve every task's env and reward, build each env once with its env_args (and each env server's), check
    the reward_args; an agent program's env_args are checked as such (`env: agent`: no env class, and maybe no
    reward). A task whose turns are chat messages needs a model with a chat template (`needs_chat_template`)."""
    problems = []
    has_template: bool | None = None
    for i, task in enumerate(job.tasks):
        problems += [f"tasks.{i} ({task.name}): {p}" for p in _env_problems(job, task)]
        if needs_chat_template(task):
            has_template = model_has_chat_template(job.model_dir) if has_template is None else has_template
            if has_template is False:
                problems.append(f"tasks.{i} ({task.name}): {_no_template(job, task)}")
        if task.reward is None:  # an agent program's task: its run() returns the reward (TaskSpec checks the env)
            continue
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


def needs_chat_template(task: TaskSpec) -> bool:
    """Whether `task`'s turns reach the model as chat messages, rendered by its chat template: an agent program's
    (`env: agent`) or a chat env's. An env that cannot be built here needs none (its own problem is reported)."""
    if task.is_agent:
        return True
    try:
        return issubclass(lookup_env(task.env).cls, ChatEnv)
    except Exception:
        return False


def model_has_chat_template(model_dir: Path) -> bool | None:
    """Whether the model in `model_dir` ships a chat template, read from its tokenizer's files alone (nothing is
    loaded): a `chat_template.jinja` (or named ones in `additional_chat_templates/`), or `chat_template` in its
    tokenizer_config.json or chat_template.json. None when this process cannot tell: no readable
    tokenizer_config.json there (a model only the workers hold, or the tiny one before its first use builds it)."""
    model_dir = Path(model_dir)
    if (model_dir / "chat_template.jinja").is_file() or any((model_dir / "additional_chat_templates").glob("*.jinja")):
        return True
    found: bool | None = None
    for name in ("tokenizer_config.json", "chat_template.json"):
        try:
            config = json.loads((model_dir / name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(config, dict) and config.get("chat_template"):
            return True
        if name == "tokenizer_config.json":
            found = False
    return found


def _no_template(job: JobSpec, task: TaskSpec) -> str:
    """Why a chat task cannot run on the job's model, and the fixes."""
    what = (
        "an agent program's requests are chat messages"
        if task.is_agent
        else f"env {task.env!r} is a chat env, whose turns are chat messages"
    )
    return (
        f"{what}, rendered by the model's chat template, but the model in model_dir {job.model_dir} has none (no "
        "chat_template in its tokenizer_config.json, no chat_template.jinja): train a chat model (an instruct model; "
        "the tiny one with a template is `model_dir: .rollart/models/tiny-chat`, built on first use, or `rollart "
        "init-model --chat --out DIR`), or add a template to that directory (chat_template.jinja)"
    )


def _env_problems(job: JobSpec, task: TaskSpec) -> list[str]:
    """What is wrong with a task's env: not found, refusing its args, or unfit for the task."""
    if task.is_agent:
        try:
            args = AgentArgs.parse(task.env_args)
        except ValueError as e:
            return [f"env_args: {e}"]
        return _agent_workflow_problems(task, args) if args.workflow is not None else []
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


def _agent_workflow_problems(task: TaskSpec, args: AgentArgs) -> list[str]:
    """A Temporal-native agent: its workflow and activities import and are what they say, the integration is
    installed, and its episodes have a reward (an agent workflow returns its answer, not a reward)."""
    from temporalio import activity, workflow

    problems = []
    if task.reward is None:
        problems.append(
            "env_args.workflow: an agent workflow returns its answer, not a reward: name the task's `reward:`, "
            "which scores its result (the transcript's final_observation) and its turns"
        )
    if importlib.util.find_spec("temporalio.openai_agents") is None:
        return [
            *problems,
            "env_args.workflow needs Temporal's OpenAI Agents SDK integration, which is not installed: install "
            "rollart's `agents` extra (`pip install 'rollart[agents]'`; `make setup` does)",
        ]
    assert args.workflow is not None
    try:
        defn = workflow._Definition.from_class(resolve_import_path(args.workflow))  # None: not a @workflow.defn
        if defn is None:
            problems.append(f"env_args.workflow: {args.workflow} is not a class decorated with @workflow.defn")
        elif defn.name != args.workflow_name:
            problems.append(
                f"env_args.workflow: {args.workflow} is registered as {defn.name!r}: set env_args.workflow_type: "
                f"{defn.name}"
            )
    except Exception as e:
        problems.append(f"env_args.workflow: {e}")
    for i, path in enumerate(args.activities):
        try:
            if activity._Definition.from_callable(resolve_import_path(path)) is None:
                problems.append(f"env_args.activities.{i}: {path} is not a function decorated with @activity.defn")
        except Exception as e:
            problems.append(f"env_args.activities.{i}: {e}")
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
