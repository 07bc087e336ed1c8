"""Built-in envs: importing this package registers them (`frozenlake`, `arithmetic`) with the registry."""

from rollart.activities.envs import arithmetic, frozenlake
from rollart.spec.env import Env, StepOutcome

__all__ = ["Env", "StepOutcome", "arithmetic", "frozenlake"]
