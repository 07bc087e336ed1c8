"""The agent task's contract at its edges: `reward:` may be left out only when an agent program returns the reward
(and one that returns none fails the job saying so), a chat task is refused at load on a model without a chat
template, `rollart rollout` prints every failure's reason whole, and a Temporal-native agent's workflow is checked
at load and registered by its env pool's workers."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError
from temporalio.exceptions import ApplicationError

from rollart.cli.rollout import failure_lines
from rollart.client.rollout import RolloutOutcome
from rollart.contracts.agent import RunAgentResult
from rollart.contracts.agent_workflow import AgentOwner, agent_owner, agent_workflow_id
from rollart.contracts.errors import ErrorType
from rollart.contracts.rollouts import TrajectoryInput, TrajectoryResult
from rollart.spec.checks import JobCheckError, check_job_components, model_has_chat_template, needs_chat_template
from rollart.spec.config import JobSpec, TaskSpec, format_validation_error, resolve, resolve_task
from rollart.spec.config.agent import AgentArgs
from rollart.workers.settings import WorkerSettings
from rollart.workflows.driver.agent import AgentEpisode

AGENT = {"name": "calc", "env": "agent", "env_args": {"entry": "m:run"}, "max_turns": 3}
CHAT_ENV = {"name": "tc", "env": "tool_calls", "reward": "success", "tool_parser": "hermes"}


def model_dir(tmp_path: Path, *, config: dict | None = None, jinja: bool = False) -> Path:
    """A model dir as the load-time check reads it: its tokenizer_config.json (and chat_template.jinja), no weights."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    if jinja:
        (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    return tmp_path


# ---- 1. `reward:` optional for an agent program that returns it -----------------------------------------------


def test_an_agent_task_may_name_no_reward_and_routes_none() -> None:
    task = resolve_task(TaskSpec.model_validate(AGENT))
    assert task.reward is None and task.reward_serverless is None
    job = JobSpec(tasks=[task])
    assert [r.what for r in job.needs().routes] == ["its env", "its generation"]
    assert not any(job.colocates_rewards(p) for p in job.pools)


def test_an_agent_task_without_reward_needs_no_reward_worker() -> None:
    """Its reward pool neither needs workers nor must exist: nothing is routed to it."""
    no_workers = {"serverless": {"role": "reward", "min_workers": 0, "max_workers": 0}}
    resolve(JobSpec(tasks=[AGENT | {"reward_pool": "judges"}], pools=no_workers))
    with pytest.raises(ValidationError, match="max_workers is 0"):
        resolve(JobSpec(tasks=[AGENT | {"reward": "success"}], pools=no_workers))
    with pytest.raises(ValidationError, match="reward_pool"):
        JobSpec(tasks=[AGENT | {"reward": "success", "reward_pool": "judges"}])


def test_a_task_of_an_env_without_reward_is_refused_saying_how() -> None:
    with pytest.raises(ValidationError) as err:
        JobSpec(tasks=[{"name": "fl", "env": "frozenlake"}])
    text = format_validation_error(err.value, "job.yaml")
    assert "tasks.0.reward: Field required: env 'frozenlake' is scored by the task's reward" in text
    assert "`reward: success`" in text and "env: agent" in text and "(got" not in text


def test_a_job_check_skips_the_reward_an_agent_task_does_not_name(tmp_path: Path) -> None:
    check_job_components(JobSpec(tasks=[AGENT], model_dir=model_dir(tmp_path, config={}, jinja=True)))


def _agent_episode(task: TaskSpec) -> AgentEpisode:
    """An agent episode past its program, as `_results` reads it: one turn played, no error."""
    episode = SimpleNamespace(error=None, turns=["a turn"], inp=SimpleNamespace(task=task))
    return AgentEpisode(episode=episode)  # type: ignore[arg-type]


def test_a_program_returning_no_reward_for_a_task_without_one_fails_the_job_saying_how() -> None:
    agent = _agent_episode(TaskSpec.model_validate(AGENT))
    with pytest.raises(ApplicationError) as err:
        asyncio.run(agent._results(RunAgentResult()))
    assert err.value.type == ErrorType.INVALID_INPUT.value and err.value.non_retryable
    assert "task 'calc'" in err.value.message
    assert "return the reward from run()" in err.value.message and "set `reward:`" in err.value.message


# ---- 2. a chat task on a model without a chat template is refused at load ---------------------------------------


@pytest.mark.parametrize("task", [AGENT, CHAT_ENV], ids=["agent", "chat-env"])
def test_a_chat_task_on_a_model_without_a_chat_template_is_refused_at_load(tmp_path: Path, task: dict) -> None:
    plain = model_dir(tmp_path / "plain", config={"eos_token": "<|endoftext|>"})
    with pytest.raises(JobCheckError, match=r"tasks.0 \(\w+\): .*chat messages") as err:
        check_job_components(JobSpec(tasks=[task], model_dir=plain))
    assert f"model in model_dir {plain} has none" in str(err.value) and "tiny-chat" in str(err.value)
    check_job_components(JobSpec(tasks=[task], model_dir=model_dir(tmp_path / "jinja", config={}, jinja=True)))
    in_config = model_dir(tmp_path / "config", config={"chat_template": "{{ messages }}"})
    check_job_components(JobSpec(tasks=[task], model_dir=in_config))


def test_a_text_task_needs_no_chat_template(tmp_path: Path) -> None:
    text = TaskSpec(name="fl", env="frozenlake", reward="success")
    assert not needs_chat_template(text)
    assert needs_chat_template(TaskSpec.model_validate(AGENT)) and needs_chat_template(TaskSpec(**CHAT_ENV))
    check_job_components(JobSpec(tasks=[text], model_dir=model_dir(tmp_path, config={})))


def test_a_model_dir_this_process_cannot_read_is_not_judged(tmp_path: Path) -> None:
    """No tokenizer config here (a model only the workers hold, the tiny one before its first use): no verdict."""
    assert model_has_chat_template(tmp_path / "absent") is None
    assert model_has_chat_template(model_dir(tmp_path / "broken")) is None
    (tmp_path / "broken" / "tokenizer_config.json").write_text("{not json")
    assert model_has_chat_template(tmp_path / "broken") is None
    named = model_dir(tmp_path / "named", config={})
    (named / "additional_chat_templates").mkdir()
    (named / "additional_chat_templates" / "tool_use.jinja").write_text("{{ messages }}")
    assert model_has_chat_template(named) is True
    assert model_has_chat_template(model_dir(tmp_path / "plain", config={})) is False


# ---- 3. `rollart rollout` prints failure reasons whole --------------------------------------------------------


def _outcome(i: int, status: str, error: str | None) -> RolloutOutcome:
    inp = TrajectoryInput(task=TaskSpec(name="fl", env="frozenlake", reward="success"), seed=i)
    result = TrajectoryResult(trajectory_id=f"t{i}", task="fl", seed=i, status=status, error=error)  # type: ignore[arg-type]
    return RolloutOutcome(workflow_id=f"w{i}", run_id="r", inp=inp, result=result, error=None, wall_s=0.1)


def test_rollout_prints_each_distinct_failure_reason_whole_with_its_count() -> None:
    long = "InvalidInput: task 'calc': its agent program returned no reward and the task names no `reward:` " * 3
    outcomes = [_outcome(0, "completed", None), _outcome(1, "failed", long), _outcome(2, "failed", long)]
    outcomes += [_outcome(3, "failed", "AgentFailed: exit 1")]
    outcomes += [RolloutOutcome("w4", "r", outcomes[0].inp, None, "WorkflowFailureError: boom", 0.1)]
    assert failure_lines(outcomes) == [
        f"failed #1: 2 × {long}",
        "failed #2: 1 × AgentFailed: exit 1",
        "error #3: 1 × WorkflowFailureError: boom",
    ]
    assert failure_lines(outcomes[:1]) == []


# ---- 4. a Temporal-native agent's workflow and activities, checked at load and registered by its env workers -----

WORKFLOW = "examples.temporal_agent.workflows:TriageWorkflow"
ACTIVITY = "examples.temporal_agent.activities:get_weather"
TEMPORAL_AGENT = {
    "name": "weather",
    "env": "agent",
    "env_args": {"workflow": WORKFLOW, "activities": [ACTIVITY], "inputs": ["q0", "q1"]},
    "reward": "success",
    "tool_parser": "hermes",
    "max_turns": 6,
}


def test_a_temporal_agent_task_loads_and_only_its_env_pools_workers_register_its_workflow(tmp_path: Path) -> None:
    pytest.importorskip("temporalio.openai_agents", reason="the `agents` extra (make setup installs it)")
    job = JobSpec(tasks=[TEMPORAL_AGENT], model_dir=model_dir(tmp_path, config={}, jinja=True))
    check_job_components(job)
    cpu = WorkerSettings.from_job(job, "cpu")
    assert (cpu.agent_workflows, cpu.agent_activities) == ((WORKFLOW,), (ACTIVITY,))
    assert WorkerSettings.from_job(job, "h800").agent_workflows == ()
    args = AgentArgs.parse(TEMPORAL_AGENT["env_args"])
    assert args.workflow_name == "TriageWorkflow" and [args.input_of(s) for s in (0, 1, 2)] == ["q0", "q1", "q0"]


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"workflow": "examples.temporal_agent.activities:Weather"}, "is not a class decorated with @workflow.defn"),
        ({"workflow_type": "Triage"}, "registered as 'TriageWorkflow': set env_args.workflow_type: TriageWorkflow"),
        ({"activities": ["examples.temporal_agent.activities:WEATHER"]}, "is not a function decorated with @activity"),
        ({"workflow": "nowhere.agents:W"}, "cannot import module 'nowhere.agents'"),
        ({"reward": None}, "an agent workflow returns its answer, not a reward: name the task's `reward:`"),
    ],
    ids=["not-a-workflow", "renamed", "not-an-activity", "no-module", "no-reward"],
)
def test_a_temporal_agent_that_cannot_run_is_refused_at_load_saying_why(tmp_path: Path, change: dict, why: str) -> None:
    pytest.importorskip("temporalio.openai_agents", reason="the `agents` extra (make setup installs it)")
    reward = change.pop("reward", "success")
    task = {**TEMPORAL_AGENT, "reward": reward, "env_args": {**TEMPORAL_AGENT["env_args"], **change}}
    with pytest.raises(JobCheckError) as err:
        check_job_components(JobSpec(tasks=[task], model_dir=model_dir(tmp_path, config={}, jinja=True)))
    assert why in str(err.value)


def test_agent_workflow_ids_name_their_trajectory_and_nothing_else_parses() -> None:
    assert agent_owner(agent_workflow_id("job-g000001-3")) == AgentOwner("job-g000001-3")
    assert agent_owner(agent_workflow_id("job-w0", "job-g000002-1")) == AgentOwner("job-w0", "job-g000002-1")
    assert [agent_owner(x) for x in ("job-g1-0", "/agent", "a//agent", "a/b/c/agent")] == [None] * 4


def test_an_agent_tasks_turns_per_workflow_must_fit_the_servers_updates() -> None:
    """Each model call is an update of the workflow playing the episode: a group workflow of 8 groups of 8 agents
    at 20 turns could take 1,280 (2,560 with requests played twice), past the server's 2,000."""
    group = {**AGENT, "rollout_unit": "group", "group_play": "free", "group_size": 8, "max_turns": 20}
    with pytest.raises(ValidationError, match=r"\(2,560 with .* temporal\.limits\.updates is 2,000"):
        JobSpec(tasks=[group])
    JobSpec(tasks=[{**group, "max_turns": 15}])  # 960 turns, 1,920 at most: fits
    JobSpec(tasks=[{**group, "rollout_unit": "trajectory", "max_turns": 900}])  # a workflow each
    with pytest.raises(ValidationError, match=r"lower max_turns or training\.groups_per_workflow"):
        JobSpec(tasks=[{**group, "max_turns": 15}], temporal={"limits": {"updates": 1000}})
