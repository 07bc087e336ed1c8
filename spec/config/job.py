"""The whole job (`JobSpec`): its sections, and the rules that span them (batches of whole groups, children
that fit the server, ...). Pure: what depends on the envs' and rewards' declarations is checked by `resolve`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from rollart.spec.config.base import DEFAULT_HOME, Section
from rollart.spec.config.engine import EngineConfig
from rollart.spec.config.env_servers import OPENENV, EnvServerSpec, fill_env_server_urls
from rollart.spec.config.kubernetes import JobNeeds, KubernetesConfig, Route
from rollart.spec.config.pools import check_placement_pools, check_routes
from rollart.spec.config.store import StoreConfig
from rollart.spec.config.task import AUTO_POOL, TaskSpec
from rollart.spec.config.temporal import TemporalConfig
from rollart.spec.config.trainer import TrainerConfig
from rollart.spec.config.training import MetricsConfig, TrainingConfig
from rollart.spec.config.weights import WeightsConfig
from rollart.spec.pools import DEFAULT_POOLS, PoolName, PoolSpec, is_generation, merge_declared, pools_with_role
from rollart.spec.routing import Unit, unit_of

__all__ = ["JobSpec"]


class JobSpec(Section):
    """A whole job. The model dir is built on first use when it is the default tiny model."""

    name: str = Field("job", min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    model_dir: Path = DEFAULT_HOME / "models" / "tiny"
    tasks: list[TaskSpec] = Field(min_length=1)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    temporal: TemporalConfig = Field(default_factory=TemporalConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    weights: WeightsConfig = Field(
        default_factory=WeightsConfig, description="how published weights travel to the engines: dtype, buckets"
    )
    metrics: MetricsConfig = Field(
        default_factory=MetricsConfig, description="metric exporters of the training client: TensorBoard, W&B"
    )
    kubernetes: KubernetesConfig | None = Field(None, description="cluster layout for `rollart k8s render`/`apply`")
    pools: dict[PoolName, PoolSpec] = Field(
        default_factory=lambda: dict(DEFAULT_POOLS),
        description="the job's pools by name: role, GPUs and (reward pools) scaling, merged over the six "
        "defaults (control, cpu, h800, h20, serverless, trainer); see spec/pools.py",
    )
    env_servers: list[EnvServerSpec] = Field(
        default_factory=list, description="OpenEnv servers run beside the workers (see EnvServerSpec)"
    )

    @model_validator(mode="before")
    @classmethod
    def _env_server_urls(cls, data: Any) -> Any:
        return fill_env_server_urls(data)

    def with_env_server_urls(self, urls: dict[str, str]) -> JobSpec:
        """This job with env servers at other URLs (by name; in the pods, their Services'), tasks pointed there."""
        servers = [s.model_copy(update={"url": urls[s.name]}) if s.name in urls else s for s in self.env_servers]
        by_name = {s.name: s.base_url for s in servers}
        tasks = [
            t.model_copy(update={"env_args": {**t.env_args, "base_url": by_name[t.env_args["server"]]}})
            if t.env == OPENENV and t.env_args.get("server") in by_name
            else t
            for t in self.tasks
        ]
        return self.model_copy(update={"env_servers": servers, "tasks": tasks})

    @model_validator(mode="before")
    @classmethod
    def _engines_serve_the_adapters(cls, data: Any) -> Any:
        """With `trainer.lora`, generation engines must serve adapters of its rank: `engine.max_lora_rank` is
        filled with it when not given (a smaller one is refused below)."""
        if not isinstance(data, dict) or data.get("trainer") is None:
            return data
        try:
            lora = TrainerConfig.model_validate(data["trainer"]).lora
        except ValueError:
            return data  # the trainer section's own validation reports it
        engine = data.get("engine") or {}
        if lora is None or (engine.max_lora_rank if isinstance(engine, EngineConfig) else engine.get("max_lora_rank")):
            return data
        if isinstance(engine, EngineConfig):
            return {**data, "engine": engine.model_copy(update={"max_lora_rank": lora.rank})}
        return {**data, "engine": {**engine, "max_lora_rank": lora.rank}}

    @model_validator(mode="after")
    def _engines_fit_the_adapters(self) -> JobSpec:
        lora, max_rank = self.trainer.lora, self.engine.max_lora_rank
        if lora is not None and max_rank is not None and max_rank < lora.rank:
            raise ValueError(
                f"engine.max_lora_rank ({max_rank}) is below trainer.lora.rank ({lora.rank}): the generation engines "
                "could not serve the adapters; raise it, or leave it out (it follows trainer.lora.rank)"
            )
        return self

    @field_validator("pools", mode="before")
    @classmethod
    def _over_the_defaults(cls, pools: Any) -> Any:
        return merge_declared(pools)

    @model_validator(mode="after")
    def _work_goes_to_declared_pools(self) -> JobSpec:
        check_routes(self.tasks, self.pools)
        return self

    @model_validator(mode="after")
    def _auto_tasks_have_pools(self) -> JobSpec:
        if not any(t.generate_pool == AUTO_POOL for t in self.tasks):
            return self
        pools = check_placement_pools(self.training.placement.pools, self.pools)
        for field in ("rates", "engines"):
            unknown = sorted(set(getattr(self.training.placement, field)) - set(pools))
            if unknown:
                raise ValueError(
                    f"training.placement.{field} names {', '.join(unknown)}, not among the placement pools "
                    f"({', '.join(pools)})"
                )
        return self

    def placement_pools(self) -> list[str]:
        """The generation pools a `generate_pool: auto` task may be placed on (`training.placement.pools`)."""
        return check_placement_pools(self.training.placement.pools, self.pools)

    def unplaced(self, task: TaskSpec) -> TaskSpec:
        """`task` as a rollout outside training plays it: an `auto` task on the first placement pool (only the
        training workflow measures and places)."""
        if task.generate_pool != AUTO_POOL:
            return task
        return task.model_copy(update={"generate_pool": self.placement_pools()[0]})

    def generate_pools_of(self, task: TaskSpec) -> list[str]:
        """Where `task`'s turns may go: its `generate_pool`, or every placement pool when it is `auto`."""
        return self.placement_pools() if task.generate_pool == AUTO_POOL else [task.generate_pool]

    @model_validator(mode="after")
    def _unique_task_names(self) -> JobSpec:
        names = [t.name for t in self.tasks]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"task names must be unique; repeated: {', '.join(dupes)}")
        return self

    @model_validator(mode="after")
    def _batches_hold_whole_groups(self) -> JobSpec:
        """A batch is built from whole GRPO groups, so every task's group_size must divide training.batch_size."""
        bad = [
            f"tasks.{i} ({t.name}) group_size {t.group_size}"
            for i, t in enumerate(self.tasks)
            if self.training.batch_size % t.group_size
        ]
        if bad:
            raise ValueError(
                f"training.batch_size {self.training.batch_size} is not a multiple of {', '.join(bad)}: a batch holds "
                "whole GRPO groups"
            )
        return self

    @model_validator(mode="after")
    def _mini_batches_fit_a_batch(self) -> JobSpec:
        if self.trainer.mini_batches > self.training.batch_size:
            raise ValueError(
                f"trainer.mini_batches ({self.trainer.mini_batches}) is more than training.batch_size "
                f"({self.training.batch_size}): a mini-batch needs at least one trajectory; lower mini_batches"
            )
        return self

    @model_validator(mode="after")
    def _children_fit_the_server(self) -> JobSpec:
        """Episodes played as workflows of their own are the training workflow's children: all of them in flight
        must fit the server's per-workflow limit, or the job hangs once it reaches it."""
        t, limit = self.training, self.temporal.max_pending_children
        episodes = [task.name for task in self.tasks if unit_of(task) is Unit.TRAJECTORY]
        in_flight = t.in_flight_limit
        if t.rollout_mode == "trajectory" and episodes and in_flight > limit:
            oversample = " (+ dynamic_sampling.oversample)" if t.dynamic_sampling.enabled else ""
            raise ValueError(
                f"training: (async_bound + 1) x batch_size{oversample} = {in_flight:,} episodes of "
                f"{', '.join(episodes)} in "
                f"flight, each a child workflow of the training workflow, but temporal.max_pending_children is "
                f"{limit:,} (the server's limit.numPendingChildExecutions.error): lower async_bound or batch_size, "
                "play the task as groups (rollout_unit: group), or raise the server's limit and this setting"
            )
        return self

    @model_validator(mode="after")
    def _agent_turns_fit_the_server(self) -> JobSpec:
        """Each model call of an agent is an update of the workflow playing its trajectory, and the server takes
        `temporal.limits.updates` in one execution: the turns one workflow may play must fit, with room for a
        request played a second time whole (refused for its history: two updates)."""
        t = self.training
        for i, task in enumerate(self.tasks):
            if not task.is_agent:
                continue
            limit = self.temporal.limits.updates
            if unit_of(task) is Unit.TRAJECTORY:
                members = 1
            elif t.rollout_mode == "batch":
                members = t.batch_size  # one workflow plays the step's groups
            else:
                members = t.groups_per_workflow * task.group_size
            turns = members * task.max_turns
            if 2 * turns > limit:
                raise ValueError(
                    f"tasks.{i} ({task.name}): one workflow plays up to {members:,} agent episodes of up to "
                    f"{task.max_turns} turns: {turns:,} model calls, each an update ({2 * turns:,} with each "
                    f"request played twice, refused for its history), but temporal.limits.updates is {limit:,} "
                    "(the server's history.maxTotalUpdates): lower max_turns or training.groups_per_workflow, or "
                    "play the task as trajectories (rollout_unit: trajectory)"
                )
        return self

    @model_validator(mode="after")
    def _workflows_fit_the_sticky_cache(self) -> JobSpec:
        """Every workflow in flight stays in the control worker's memory (sticky execution): one evicted replays
        its whole history on each of its workflow tasks, which at hundreds of trajectories a step turns the
        control worker's CPU into replay."""
        t, cache = self.training, self.temporal.workers.max_cached_workflows
        episodes = [task.name for task in self.tasks if unit_of(task) is Unit.TRAJECTORY]
        workflows = t.in_flight_limit + 1  # the episodes' and the training workflow
        if t.rollout_mode == "trajectory" and episodes and workflows > cache:
            raise ValueError(
                f"training: {t.in_flight_limit:,} episodes of {', '.join(episodes)} in flight, each a workflow, and "
                f"the training workflow are {workflows:,}, but temporal.workers.max_cached_workflows is {cache:,}: "
                "a workflow the control worker cannot keep in memory replays its whole history on every workflow "
                "task; raise max_cached_workflows, lower async_bound or batch_size, or play the task as groups "
                "(rollout_unit: group)"
            )
        return self

    def elastic(self, pool: str) -> PoolSpec:
        """The declaration of a reward pool, whose scaling fields say how its workers scale (it is elastic)."""
        spec = self.pools.get(pool)
        if spec is None or spec.role != "reward":
            reward = ", ".join(pools_with_role(self.pools, "reward")) or "none"
            raise ValueError(f"pool {pool!r} is not elastic; only reward pools scale: {reward}")
        return spec

    def colocates_rewards(self, pool: str) -> bool:
        """Whether some task runs its reward on `pool`'s generation workers (colocated, or declared so)."""
        return is_generation(self.pools, pool) and any(
            t.reward is not None and t.reward_queue == pool for t in self.tasks
        )

    def hosts_envs(self, pool: str) -> bool:
        """Whether some task's env sessions live on `pool`'s workers (its `env_pool`)."""
        return any(t.env_queue == pool for t in self.tasks)

    def needs(self) -> JobNeeds:
        """What this job asks of a deployment (`kubernetes` checks and lays out its pools from it)."""
        routes = []
        for t in self.tasks:
            routes += [Route(t.name, "its env", t.env, t.env_queue)]
            routes += [Route(t.name, "its generation", None, pool) for pool in self.generate_pools_of(t)]
            if t.reward is not None:  # an agent program's task whose run() returns its reward has none
                routes += [Route(t.name, "its reward", t.reward, t.reward_queue)]
        parallel = self.trainer.parallel
        return JobNeeds(
            pools=self.pools,
            routes=tuple(routes),
            tensor_parallel_size=self.engine.tensor_parallel_size,
            trainer_tensor=parallel.tensor,
            trainer_data=parallel.data,
            trainer_fsdp=self.trainer.fsdp.ranks if self.trainer.fsdp is not None else 0,
        )

    def task(self, name: str) -> TaskSpec:
        """The task called `name`, or a KeyError listing the ones there are."""
        for t in self.tasks:
            if t.name == name:
                return t
        raise KeyError(f"no task {name!r} in job {self.name!r}; tasks: {', '.join(t.name for t in self.tasks)}")
