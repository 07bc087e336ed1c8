"""The job spec: one validated description of a job (model, tasks, pools, Temporal, store).

Loaded from YAML or JSON with `load_job`; every error names the file and the field (`tasks.0.generate_pool`)
and says what was expected. Components get their own small section (`EngineConfig`, `StoreConfig`, ...) rather
than the whole job. A module per part of the job:

- `task`: a task (`TaskSpec`: env, reward, sampling, prompt, faults)
- `engine`, `trainer`, `training`: the inference engine; the trainer and its loss; the loop and its metrics
- `temporal`, `store`, `weights`: the Temporal connection and workers; where bulk data lives; how published
  weights travel
- `pools`: the rules on which pool may do what (the declarations themselves: spec/pools.py)
- `env_servers`: OpenEnv servers run beside the workers
- `job`: the whole job (`JobSpec`) and the rules that span its sections
- `resolve`: the explicit step that reads the envs' and rewards' declarations (the only one importing user code)
- `load`: reading a file (`load_job`: parse, validate, resolve)

The `kubernetes:` section is `KubernetesConfig` of spec/config/kubernetes.py. Workflow code imports these modules
(through the sandbox's pass-through), so they hold pydantic models only: no I/O at import time, no heavy imports.
This package's names are its public API: import them from `rollart.spec.config`.
"""

from rollart.spec.config.base import DEFAULT_HOME
from rollart.spec.config.engine import AffinityConfig, EngineConfig, PriorityPolicy
from rollart.spec.config.env_servers import OPENENV, EnvServerSpec
from rollart.spec.config.job import JobSpec
from rollart.spec.config.load import JobSpecError, format_validation_error, load_job
from rollart.spec.config.resolve import resolve, resolve_task
from rollart.spec.config.store import MooncakeConfig, StoreConfig
from rollart.spec.config.task import (
    AGENT_ENV,
    AUTO_POOL,
    FaultModel,
    GroupPlay,
    LatencyModel,
    PromptFormat,
    RewardPlacement,
    SamplingParams,
    TaskEnv,
    TaskSpec,
)
from rollart.spec.config.temporal import TemporalConfig, TemporalLimits, TemporalTLS, TracingConfig, WorkerTuning
from rollart.spec.config.trainer import (
    FsdpConfig,
    LoraConfig,
    LossConfig,
    LRScheduleConfig,
    PackingConfig,
    ParallelConfig,
    SequenceMode,
    TrainerConfig,
)
from rollart.spec.config.training import (
    AdmissionConfig,
    DynamicSamplingConfig,
    MetricsConfig,
    PlacementConfig,
    StallConfig,
    StopWhen,
    TrainingConfig,
    WandbConfig,
)
from rollart.spec.config.weights import WeightsConfig

__all__ = [
    "AGENT_ENV",
    "AUTO_POOL",
    "DEFAULT_HOME",
    "OPENENV",
    "AdmissionConfig",
    "AffinityConfig",
    "DynamicSamplingConfig",
    "EngineConfig",
    "EnvServerSpec",
    "FaultModel",
    "FsdpConfig",
    "GroupPlay",
    "JobSpec",
    "JobSpecError",
    "LRScheduleConfig",
    "LatencyModel",
    "LoraConfig",
    "LossConfig",
    "MetricsConfig",
    "MooncakeConfig",
    "PackingConfig",
    "ParallelConfig",
    "PlacementConfig",
    "PriorityPolicy",
    "PromptFormat",
    "RewardPlacement",
    "SamplingParams",
    "SequenceMode",
    "StallConfig",
    "StopWhen",
    "StoreConfig",
    "TaskEnv",
    "TaskSpec",
    "TemporalConfig",
    "TemporalLimits",
    "TemporalTLS",
    "TracingConfig",
    "TrainerConfig",
    "TrainingConfig",
    "WandbConfig",
    "WeightsConfig",
    "WorkerTuning",
    "format_validation_error",
    "load_job",
    "resolve",
    "resolve_task",
]
