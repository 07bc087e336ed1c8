"""What a user writes against, in one import: `from rollart.sdk import Env, StepOutcome, env, reward, ...`.

Envs (`Env`, `ChatEnv`, `StepOutcome`, `EnvSessionLost`), the episode a reward scores (`Transcript`, `TurnRecord`,
`RewardResult`, `ChatMessage`), the declarations that route the work (`env`, `reward`), and the job spec
(`load_job`, `JobSpec`). The names stay where they are defined; this module is their public address, so the
project may move its rooms without breaking your envs. Light: importing it loads no torch, vLLM or Temporal
worker (docs/envs.md).
"""

from rollart.contracts.activities import RewardResult, Transcript, TurnRecord
from rollart.spec.chat import ChatMessage
from rollart.spec.config import JobSpec
from rollart.spec.config.load import load_job
from rollart.spec.env import ChatEnv, Env, EnvSessionLost, StepOutcome
from rollart.spec.registry import env, reward

__all__ = [
    "ChatEnv",
    "ChatMessage",
    "Env",
    "EnvSessionLost",
    "JobSpec",
    "RewardResult",
    "StepOutcome",
    "Transcript",
    "TurnRecord",
    "env",
    "load_job",
    "reward",
]
