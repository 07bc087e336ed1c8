"""Built-in envs: importing this package registers them (`frozenlake`, `arithmetic`) with the registry."""

from rollart.activities.envs import arithmetic, frozenlake
from rollart.activities.envs.base import Env, StepOutcome

__all__ = ["Env", "StepOutcome", "arithmetic", "frozenlake"]
