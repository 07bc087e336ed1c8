"""The Env contract: StepOutcome checks its payload, the base class rejects unknown env_args."""

from __future__ import annotations

import math

import pytest

from rollart.spec.env import Env, StepOutcome


class _Echo(Env):
    def __init__(self, *, prefix: str = "", **rest: object) -> None:
        super().__init__(**rest)
        self.prefix = prefix

    def reset(self, seed: int) -> str:
        return f"{self.prefix}{seed}"

    def step(self, action: str) -> StepOutcome:
        return StepOutcome(observation=self.prefix + action, reward=0.0, done=True, info={})


def test_env_is_abstract() -> None:
    with pytest.raises(TypeError):
        Env()  # type: ignore[abstract]


def test_subclass_with_known_args_works_and_close_is_a_no_op() -> None:
    echo = _Echo(prefix=">")
    assert echo.reset(3) == ">3"
    assert echo.step("hi").observation == ">hi"
    assert echo.close() is None


def test_unknown_env_args_are_rejected_by_name() -> None:
    with pytest.raises(ValueError, match="prefx"):
        _Echo(prefx=">")


def test_step_outcome_accepts_json_info() -> None:
    info = {"a": 1, "b": [1.5, None, "x", True], "c": {"d": []}}
    assert StepOutcome("obs", 1, False, info).info == info


@pytest.mark.parametrize(
    "info",
    [{"p": (1, 2)}, {"p": {1: "x"}}, {"p": object()}, {"p": math.nan}, {"p": [{"q": {1, 2}}]}],
)
def test_step_outcome_rejects_non_json_info(info: dict) -> None:
    with pytest.raises(TypeError):
        StepOutcome("obs", 0.0, False, info)


@pytest.mark.parametrize(
    ("observation", "reward", "done"),
    [(1, 0.0, False), ("o", math.inf, False), ("o", True, False), ("o", "1", False), ("o", 0.0, 1)],
)
def test_step_outcome_rejects_bad_fields(observation: object, reward: object, done: object) -> None:
    with pytest.raises(TypeError):
        StepOutcome(observation, reward, done, {})  # type: ignore[arg-type]
