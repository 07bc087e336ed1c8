"""What one worker process is told: its pool and role, where Temporal and the store are, and (per role) its model,
engine, rewards, env sessions and trainer nodes; `WorkerSettings.from_job` derives them from a job's declarations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollart.spec.config import EngineConfig, JobSpec, StoreConfig, TemporalConfig, TrainerConfig
from rollart.spec.config.agent import AgentArgs
from rollart.spec.pools import DEFAULT_POOLS, PoolName, PoolRole

__all__ = ["TrainerNodes", "WorkerSettings"]


class TrainerNodes(BaseModel):
    """Where this trainer worker sits among the trainer's nodes (torchrun-style rendezvous).

    One `rollart worker --pool trainer` runs per node; each starts `world_size / nnodes` ranks. Node 0
    polls Temporal and hosts the rendezvous store at `rdzv` (HOST:PORT, reachable from every node);
    the others follow it. One node needs none of this: its store binds a free loopback port.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    nnodes: int = Field(1, ge=1)
    node_rank: int = Field(0, ge=0)
    rdzv: str | None = Field(None, pattern=r"^[A-Za-z0-9_.\-\[\]:]+:[0-9]{1,5}$")

    @model_validator(mode="after")
    def _consistent(self) -> TrainerNodes:
        if self.node_rank >= self.nnodes:
            raise ValueError(f"--node-rank {self.node_rank} is not below --nnodes {self.nnodes}")
        if self.nnodes > 1 and self.rdzv is None:
            raise ValueError(f"{self.nnodes} nodes need --rdzv HOST:PORT: node 0's address, reachable from every node")
        return self


class WorkerSettings(BaseModel):
    """Everything one worker process needs: where Temporal and the store are, and for generation the model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pool: PoolName
    role: PoolRole
    """What the pool's workers serve (from the job's declaration; a default pool's without a job)."""
    temporal: TemporalConfig = TemporalConfig()
    store: StoreConfig = StoreConfig()
    model_dir: Path = JobSpec.model_fields["model_dir"].default
    engine: EngineConfig = EngineConfig()
    max_concurrent_activities: int = 256
    serve_rewards: bool = False
    """Generation pools: also register the reward activities (`reward_placement: colocated`)."""
    serve_envs: bool = False
    """Generation pools: also hold env sessions (a task whose env declares this pool, `@env(pool=...)`)."""
    agent_workflows: tuple[str, ...] = ()
    """Env pools: the Temporal-native agent workflows (`env_args.workflow`) of the job's tasks whose env queue is
    this pool's, which this worker registers on the pool's agent queue (workers/agent_worker.py)."""
    agent_activities: tuple[str, ...] = ()
    """Env pools: the activities those agent workflows use as tools (`env_args.activities`)."""
    trainer: TrainerConfig = TrainerConfig()
    """Trainer pool: the job's trainer section (the megatron backend's ranks are laid out by it)."""
    nodes: TrainerNodes = TrainerNodes()
    connect_timeout_s: float | None = Field(None, gt=0)
    """How long to wait for Temporal (and the Mooncake master) before exiting; None: as long takes."""
    ready_file: Path | None = None
    parent_pid: int | None = None
    """The local stack or autoscaler that started this worker: its death sends the worker SIGTERM (drain, exit)."""

    @model_validator(mode="before")
    @classmethod
    def _default_role(cls, data: Any) -> Any:
        """Without a job, a default pool's role (`rollart worker --pool h800`); any other pool needs its job."""
        if not isinstance(data, dict) or "role" in data or not isinstance(data.get("pool"), str):
            return data
        default = DEFAULT_POOLS.get(data["pool"])
        if default is None:
            raise ValueError(
                f"pool {data['pool']!r} is not one of the default pools ({', '.join(DEFAULT_POOLS)}): its role "
                "comes from the job that declares it (pass --job)"
            )
        return {**data, "role": default.role}

    @classmethod
    def from_job(cls, job: JobSpec, pool: str, **overrides: object) -> WorkerSettings:
        """The settings a job implies for a worker of `pool`, one of the pools it declares."""
        spec = job.pools.get(pool)
        if spec is None:
            raise ValueError(f"pool {pool!r} is not declared in job {job.name!r}; its pools: {', '.join(job.pools)}")
        base: dict[str, object] = {
            "pool": pool,
            "role": spec.role,
            "temporal": job.temporal,
            "store": job.store,
            "model_dir": job.model_dir,
            "engine": job.engine,
            "trainer": job.trainer,
        }
        if spec.role == "reward":
            base["max_concurrent_activities"] = spec.max_concurrent_activities
        if spec.role == "generation":
            base["serve_rewards"] = job.colocates_rewards(pool)
            base["serve_envs"] = job.hosts_envs(pool)
        if spec.role == "env":
            agents = [AgentArgs.parse(t.env_args) for t in job.tasks if t.is_agent and t.env_queue == pool]
            base["agent_workflows"] = tuple(sorted({a.workflow for a in agents if a.workflow is not None}))
            base["agent_activities"] = tuple(sorted({path for a in agents for path in a.activities}))
        return cls(**{**base, **overrides})
