"""Built-in envs: importing this package registers them (`frozenlake`) with the registry."""

from rollart.activities.envs import frozenlake
from rollart.activities.envs.base import Env, StepOutcome

__all__ = ["Env", "StepOutcome", "frozenlake"]
