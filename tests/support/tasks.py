"""Job pieces many tests build: the default FrozenLake task, with overrides."""

from __future__ import annotations

from rollart.infra.config import TaskSpec

__all__ = ["frozenlake_task"]


def frozenlake_task(**overrides: object) -> TaskSpec:
    """The default multi-turn task, random 4x4 maps."""
    base = {
        "name": "frozenlake",
        "env": "frozenlake",
        "env_args": {"maps": "random", "size": 4},
        "reward": "success",
        "generate_pool": "h800",
        "max_turns": 6,
    }
    return TaskSpec.model_validate({**base, **overrides})
