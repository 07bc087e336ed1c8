"""The job spec's resolve step: validating a spec imports no user code; `resolve` (and `load_job`) reads the
envs' and rewards' declarations, fills where they run, and checks the rules that depend on it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from rollart.spec.config import JobSpec, JobSpecError, TaskSpec, load_job, resolve, resolve_task
from rollart.spec.pools import Pool

USER_MODULE = """
from rollart.activities.envs.frozenlake import FrozenLake
from rollart.spec.registry import env, reward


@env("maze-of-{tag}", pool="h20")
class Maze(FrozenLake):
    pass


@reward("score-of-{tag}", serverless=False)
def score(transcript):
    return 1.0
"""


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[str]:
    """An importable module of the user's, not imported yet, whose env declares h20 and whose reward must run
    beside generation; removed from sys.modules afterwards."""
    name = f"user_envs_{request.node.name}"
    (tmp_path / f"{name}.py").write_text(USER_MODULE.replace("{tag}", request.node.name))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def spec(module: str, **extra: object) -> dict:
    return {"tasks": [{"name": "t", "env": f"{module}:Maze", "reward": f"{module}:score", **extra}]}


def test_validating_a_spec_imports_none_of_the_users_modules(user_module: str) -> None:
    job = JobSpec.model_validate(spec(user_module))
    assert user_module not in sys.modules
    assert job.tasks[0].env_pool is None and job.tasks[0].reward_serverless is None
    JobSpec.model_validate_json(job.model_dump_json())  # as a worker decodes it
    assert user_module not in sys.modules


def test_resolve_fills_where_the_env_and_reward_declare_they_run(user_module: str) -> None:
    task = resolve(JobSpec.model_validate(spec(user_module, generate_pool="h800"))).tasks[0]
    assert user_module in sys.modules
    assert task.env_pool == Pool.H20 and task.env_queue == "h20"
    assert task.reward_serverless is False and task.reward_queue == "h800"
    assert resolve_task(task) == task  # resolving twice changes nothing


def test_what_a_task_says_itself_is_kept(user_module: str) -> None:
    given = TaskSpec.model_validate(spec(user_module, env_pool="h800", reward_serverless=True)["tasks"][0])
    assert resolve_task(given) is given


def test_load_job_resolves(user_module: str, tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text(JobSpec.model_validate(spec(user_module)).model_dump_json(exclude_unset=True))
    assert load_job(path).tasks[0].env_queue == "h20"


def test_rules_on_declared_placement_are_checked_by_resolve(user_module: str, tmp_path: Path) -> None:
    """The reward declares it runs beside generation, so a serverless pool without workers is no problem; the
    kubernetes layout must give the env's pool, h20, workers, not cpu."""
    no_serverless = {"serverless": {"min_workers": 0, "max_workers": 0}}
    resolve(JobSpec.model_validate({**spec(user_module), "pools": no_serverless}))
    no_h20 = {"pools": {"h20": {"replicas": 0}}, "temporal_address": "temporal:7233"}
    job = JobSpec.model_validate({**spec(user_module), "kubernetes": no_h20})  # placement not known yet
    with pytest.raises(ValidationError, match=r"kubernetes: task 't': its env .* runs on pool 'h20', which has no"):
        resolve(job)
    path = tmp_path / "job.json"
    path.write_text(job.model_dump_json(exclude_unset=True))
    with pytest.raises(JobSpecError) as err:
        load_job(path)
    assert str(err.value).startswith(f"{path}: invalid job spec (1 problem)\n  (top level): Value error, kubernetes:")
