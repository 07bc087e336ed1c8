"""The affinity registry and import-path resolution: what a job may name, and the errors when it can't."""

from __future__ import annotations

import pytest
from rollart.activities.envs.frozenlake import FrozenLake
from rollart.activities.rewards.rule_based import exact_match, success
from rollart.infra.imports import ImportPathError, is_import_path, resolve_import_path
from rollart.infra.pools import Pool
from rollart.infra.registry import Registry, UnknownComponentError, env, lookup_env, lookup_reward, reward


def test_builtins_are_registered_with_their_pools() -> None:
    assert lookup_env("frozenlake").cls is FrozenLake
    assert lookup_env("frozenlake").pool is Pool.CPU
    assert lookup_reward("success").fn is success
    assert lookup_reward("exact_match").fn is exact_match
    assert lookup_reward("success").pool is Pool.SERVERLESS


def test_unknown_names_list_what_exists() -> None:
    with pytest.raises(UnknownComponentError, match=r"unknown env 'frozenlak'.*frozenlake"):
        lookup_env("frozenlak")
    with pytest.raises(UnknownComponentError, match=r"unknown reward 'sucess'.*success"):
        lookup_reward("sucess")


def test_import_paths_resolve_users_own_components() -> None:
    entry = lookup_env("tests.support.envs:BrokenStepEnv")
    assert entry.cls.__name__ == "BrokenStepEnv"
    assert entry.pool is Pool.CPU
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
    from rollart.infra.registry import EnvEntry

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
