"""The affinity registry and import-path resolution: what a job may name, and the errors when it can't."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollart.activities.envs.frozenlake import FrozenLake
from rollart.activities.rewards.rule_based import exact_match, success
from rollart.spec.imports import ImportPathError, is_import_path, resolve_import_path
from rollart.spec.pools import Pool
from rollart.spec.registry import Registry, UnknownComponentError, env, lookup_env, lookup_reward, reward


def test_builtins_are_registered_with_their_pools() -> None:
    assert lookup_env("frozenlake").cls is FrozenLake
    assert lookup_env("frozenlake").pool == Pool.CPU
    assert lookup_reward("success").fn is success
    assert lookup_reward("exact_match").fn is exact_match
    assert lookup_reward("success").pool == Pool.SERVERLESS


def test_unknown_names_list_what_exists() -> None:
    with pytest.raises(UnknownComponentError, match=r"unknown env 'frozenlak'.*frozenlake"):
        lookup_env("frozenlak")
    with pytest.raises(UnknownComponentError, match=r"unknown reward 'sucess'.*success"):
        lookup_reward("sucess")


def test_import_paths_resolve_users_own_components() -> None:
    entry = lookup_env("tests.support.envs:BrokenStepEnv")
    assert entry.cls.__name__ == "BrokenStepEnv"
    assert entry.pool == Pool.CPU
    assert lookup_reward("rollart.activities.rewards.rule_based:success").fn is success
    assert lookup_env("rollart.activities.envs.frozenlake:FrozenLake").cls is FrozenLake


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        ("no_such_pkg.mod:Env", "cannot import module 'no_such_pkg.mod'"),
        ("tests.support.envs:Nope", "has no attribute 'Nope'"),
        ("tests.support.envs:", "not an import path"),
    ],
)
def test_bad_import_paths_say_which_part_failed(path: str, fragment: str) -> None:
    with pytest.raises(UnknownComponentError, match=fragment):
        lookup_env(path)


def test_import_path_helpers() -> None:
    assert is_import_path("pkg.mod:Name") and not is_import_path("frozenlake")
    assert resolve_import_path("os.path:join") is __import__("os").path.join
    with pytest.raises(ImportPathError):
        resolve_import_path("os.path")


def test_declarations_are_checked_when_declared() -> None:
    with pytest.raises(TypeError, match="lacks step"):

        @env("half-env-for-test")
        class Half:
            def reset(self, seed: int) -> str:
                return ""

    with pytest.raises(TypeError, match="exactly one argument"):

        @reward("two-args-for-test")
        def two(a: object, b: object) -> float:
            return 0.0

    with pytest.raises(ValueError, match="timeouts must be positive"):
        env("neg", reset_timeout=0)


def test_a_name_cannot_be_taken_twice() -> None:
    reg = Registry()
    from rollart.spec.registry import EnvEntry

    reg.add_env(EnvEntry(name="x", cls=FrozenLake))
    reg.add_env(EnvEntry(name="x", cls=FrozenLake))  # re-declaring the same class is fine (module reload)

    class Other(FrozenLake):
        pass

    with pytest.raises(ValueError, match="already declared"):
        reg.add_env(EnvEntry(name="x", cls=Other))


def test_non_class_env_and_non_callable_reward_are_rejected() -> None:
    with pytest.raises(UnknownComponentError):
        lookup_env("tests.support.envs:no_such")
    with pytest.raises(TypeError, match="must be a class"):
        lookup_env("os.path:join")
    with pytest.raises(TypeError, match="must be a function"):
        lookup_reward("tests.support.envs:BrokenStepEnv")


# ---------------------------------------------------------------- built-ins through entry points


@pytest.mark.integration
def test_builtins_load_by_name_in_a_fresh_process() -> None:
    """No set-up step: the registry finds a built-in through its entry point when its name is first asked for."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from rollart.spec.registry import lookup_env, lookup_reward, registry\n"
        "assert lookup_env('frozenlake').cls.__name__ == 'FrozenLake'\n"
        "assert 'rollart.activities.rewards.model_based' not in sys.modules\n"
        "assert lookup_reward('exact_match').fn.__name__ == 'exact_match'\n"
        "assert {'arithmetic', 'frozenlake'} <= set(registry.env_names())\n"
        "assert {'success', 'progress', 'exact_match', 'reward_model'} <= set(registry.reward_names())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_registry_names_no_implementation() -> None:
    """The inversion: infra finds the built-ins by entry point; it never names the activities package."""
    import rollart.spec.registry as registry_module

    assert "rollart.activities" not in Path(registry_module.__file__).read_text()


# ---------------------------------------------------------------- where declared envs and rewards run


@env("on-h20-for-test", pool="h20")
class BesideTheEngine(FrozenLake):
    """An env that needs the generation pool's hardware: its sessions live on the h20 workers."""


def test_an_env_runs_on_the_pool_it_declares() -> None:
    from rollart.spec.config import JobSpec, TaskSpec, resolve_task
    from rollart.workers.local_stack import pools_for_job
    from rollart.workers.settings import WorkerSettings

    assert lookup_env("on-h20-for-test").pool == Pool.H20
    task = resolve_task(TaskSpec(name="t", env="on-h20-for-test", reward="success", generate_pool="h800"))
    assert task.env_pool == Pool.H20 and task.env_queue == "h20"
    assert TaskSpec.model_validate_json(task.model_dump_json()).env_queue == "h20"  # it travels as data
    job = JobSpec(tasks=[task])
    assert job.hosts_envs(Pool.H20) and not job.hosts_envs(Pool.CPU)
    assert WorkerSettings.from_job(job, Pool.H20).serve_envs
    assert not WorkerSettings.from_job(job, Pool.H800).serve_envs
    assert pools_for_job(job) == [Pool.CONTROL, Pool.CPU, Pool.H20, Pool.H800, Pool.SERVERLESS]
    assert resolve_task(TaskSpec(name="t", env="frozenlake", reward="success")).env_queue == "cpu"


def test_rollart_up_warns_when_pools_leave_the_envs_or_rewards_unserved(capsys: pytest.CaptureFixture[str]) -> None:
    from rollart.cli.up import _warn_unserved
    from rollart.spec.config import JobSpec, TaskSpec, resolve

    job = resolve(JobSpec(tasks=[TaskSpec(name="t", env="on-h20-for-test", reward="success", generate_pool="h800")]))
    _warn_unserved(job, [Pool.CONTROL, Pool.CPU, Pool.H800])
    err = capsys.readouterr().err
    assert "the job's envs run on h20" in err and "the job's rewards run on serverless" in err
    _warn_unserved(job, [Pool.CONTROL, Pool.H20, Pool.H800, Pool.SERVERLESS])
    assert capsys.readouterr().err == ""


def test_an_env_on_a_pool_that_cannot_hold_sessions_is_refused_when_declared() -> None:
    with pytest.raises(ValueError, match=r"env 'x': pool 'serverless' cannot hold env sessions.*cpu, h800, h20"):
        env("x", pool="serverless")
    with pytest.raises(ValueError, match=r"pool 'no such pool' cannot hold env sessions"):
        env("x", pool="no such pool")
    from pydantic import ValidationError

    from rollart.spec.config import JobSpec, TaskSpec

    task = TaskSpec(name="t", env="frozenlake", reward="success", env_pool="trainer")  # the job checks it
    with pytest.raises(ValidationError, match=r"tasks.0.env_pool: pool 'trainer' has role trainer, not env or gen"):
        JobSpec(tasks=[task])


@env("in-a-sandbox-for-test", pool="sandbox")
class InASandbox(FrozenLake):
    """An env whose sessions live on a pool no default names: the jobs using it declare that pool."""


def test_an_env_on_a_pool_of_its_own_needs_a_job_that_declares_it() -> None:
    from pydantic import ValidationError

    from rollart.spec.config import JobSpec, TaskSpec, resolve, resolve_task
    from rollart.workers.local_stack import pools_for_job

    unresolved = TaskSpec(name="t", env="in-a-sandbox-for-test", reward="success")
    task = resolve_task(unresolved)
    assert task.env_queue == "sandbox"
    with pytest.raises(ValidationError, match=r"tasks.0.env_pool: pool 'sandbox' is not declared \(pools: control,"):
        JobSpec(tasks=[task])
    with pytest.raises(ValidationError, match=r"tasks.0.env_pool: pool 'sandbox' is not declared"):
        resolve(JobSpec(tasks=[unresolved]))  # validated before the declaration was read: resolve checks again
    job = JobSpec(tasks=[task], pools={"sandbox": {"role": "env"}})
    assert job.hosts_envs("sandbox") and not job.hosts_envs(Pool.CPU)
    assert pools_for_job(job) == ["control", "cpu", "sandbox", "h800", "serverless"]


def test_an_env_not_importable_where_the_spec_loads_keeps_the_default_pool(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from rollart.spec.config import TaskSpec, resolve_task

    with caplog.at_level(logging.DEBUG, logger="rollart.spec.registry"):
        task = resolve_task(TaskSpec(name="t", env="only_on_the_workers.envs:Maze", reward="success"))
    assert task.env_pool is None and task.env_queue == "cpu"
    assert "only_on_the_workers.envs:Maze" in caplog.text


def test_a_reward_declared_not_serverless_runs_on_the_generation_pool() -> None:
    from rollart.spec.config import JobSpec, TaskSpec, resolve_task
    from rollart.workers.settings import WorkerSettings

    task = TaskSpec(name="t", env="frozenlake", reward="tests.support.rewards:beside_generation", generate_pool="h20")
    assert task.reward_serverless is None  # validating reads no declaration: resolving does
    task = resolve_task(task)
    assert task.reward_serverless is False and task.reward_placement == "serverless"
    assert task.reward_queue == "h20"
    job = JobSpec(tasks=[task])
    assert job.colocates_rewards(Pool.H20) and WorkerSettings.from_job(job, Pool.H20).serve_rewards
    assert TaskSpec(name="t", env="frozenlake", reward="success").reward_queue == "serverless"
