"""The job spec: one validated description of a job (model, tasks, pools, Temporal, store).

Loaded from YAML or JSON with `load_job`; every error names the file and the
field (`tasks.0.generate_pool`) and says what was expected. Components get
their own small section (`EngineConfig`, `StoreConfig`, ...) rather than the
whole job.

This module is imported by workflow code (through the sandbox's pass-through),
so it holds pydantic models only: no I/O at import time, no heavy imports.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from temporalio import workflow

from rollart.infra.k8s_config import JobNeeds, KubernetesConfig, Route
from rollart.infra.pools import (
    DEFAULT_POOLS,
    QUEUE_PREFIX_PATTERN,
    SESSION_ROLES,
    Pool,
    PoolName,
    PoolSpec,
    check_fixed_roles,
    is_generation,
    merge_declared,
    pools_with_role,
    role_problem,
)
from rollart.infra.registry import declared_env_pool, declared_reward_serverless

__all__ = [
    "DEFAULT_HOME",
    "EngineConfig",
    "EnvServerSpec",
    "FaultModel",
    "JobSpec",
    "JobSpecError",
    "LatencyModel",
    "LossConfig",
    "MetricsConfig",
    "MooncakeConfig",
    "ParallelConfig",
    "PromptFormat",
    "RewardPlacement",
    "SamplingParams",
    "StallConfig",
    "StopWhen",
    "StoreConfig",
    "TaskEnv",
    "TaskSpec",
    "TemporalConfig",
    "TemporalTLS",
    "TracingConfig",
    "TrainerConfig",
    "TrainingConfig",
    "WandbConfig",
    "WorkerTuning",
    "check_batches_hold_groups",
    "format_validation_error",
    "load_job",
]

DEFAULT_HOME = Path(".rollart")
"""Where the local stack keeps generated things (model, Temporal database, store), relative to the cwd."""


class _Strict(BaseModel):
    """Base for spec sections: unknown keys are errors (a typo must not be silently ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


RewardPlacement = Literal["serverless", "colocated"]
"""Where a task's reward runs: on the elastic "serverless" pool, or on the worker of its generation pool."""


class SamplingParams(_Strict):
    """How a task samples from the policy. `top_k = 0` means the full vocabulary (no truncation)."""

    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    max_tokens: int = Field(2, ge=1, le=4096)
    n: int = Field(1, ge=1, le=256)
    stop: list[str] = Field(default_factory=list)


class PromptFormat(_Strict):
    """How an env's observation becomes the text the policy is prompted with.

    Instruct models were trained on conversations, so by default (`chat: auto`) the observation is sent as
    the user's message through the model's own chat template (with `system` first, if given), ending where
    the assistant's reply starts; a model without a chat template (the tiny one) gets the observation as raw
    text. `always` refuses a model without a template; `never` sends raw text whatever the model.
    """

    chat: Literal["auto", "always", "never"] = "auto"
    system: str | None = Field(None, min_length=1, description="the system message, before the observation")

    @model_validator(mode="after")
    def _system_needs_a_template(self) -> PromptFormat:
        if self.system is not None and self.chat == "never":
            raise ValueError("prompt.system is sent through the chat template, which chat: never turns off")
        return self


class LatencyModel(_Strict):
    """A lognormal latency given by its median and its 99th percentile (a long tail: p99 ≫ median).

    ln(latency) ~ Normal(ln(median), σ) with σ = ln(p99 / median) / 2.3263 (the normal's 0.99 quantile).
    """

    median_s: float = Field(0.0, ge=0.0)
    p99_s: float = Field(0.0, ge=0.0)

    @model_validator(mode="after")
    def _p99_above_median(self) -> LatencyModel:
        if self.p99_s < self.median_s:
            raise ValueError(f"p99_s ({self.p99_s:g}) must be at least median_s ({self.median_s:g})")
        return self


class FaultModel(_Strict):
    """Injected env latency and failures (tests, benchmarks, chaos runs): any env can run under it.

    `reset_failure_p` / `step_failure_p`: probability that a reset / step raises instead of running.
    An injected step failure happens before the env is touched, so it is transient (retried); an
    injected reset failure is an env reset that raised (retried with a fresh env). `seed` makes the
    draws reproducible per worker process.
    """

    reset_latency: LatencyModel = Field(default_factory=LatencyModel)
    step_latency: LatencyModel = Field(default_factory=LatencyModel)
    reset_failure_p: float = Field(0.0, ge=0.0, le=1.0)
    step_failure_p: float = Field(0.0, ge=0.0, le=1.0)
    seed: int = 0


class TaskSpec(_Strict):
    """One task of a job: which env and reward, where it generates, how it samples.

    `env` and `reward` are registered names (`frozenlake`) or import paths of a
    user's own (`mypkg.envs:Maze`). `reward_placement` says where the reward runs:
    `serverless` (on `reward_pool`, elastic, the default) or `colocated` (on the worker of
    `generate_pool`, competing with generation: the monolithic baseline). The pools are names the job
    declares (`JobSpec.pools`); the job checks each has the role its work needs.

    Where the env and reward *declare* they run (`@env(pool=...)`, `@reward(serverless=...)`) is
    read once, where the spec is validated outside a workflow, into `env_pool` and
    `reward_serverless`, so that it travels with the spec to the workflows as data.
    """

    name: str = Field(min_length=1)
    env: str = Field(min_length=1)
    reward: str = Field(min_length=1)
    env_args: dict[str, Any] = Field(default_factory=dict)
    reward_args: dict[str, Any] = Field(
        default_factory=dict, description="arguments of a reward model's `from_args` (function rewards take none)"
    )
    reward_placement: RewardPlacement = "serverless"
    generate_pool: PoolName = Pool.H800.value
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    prompt: PromptFormat = Field(default_factory=PromptFormat)
    max_turns: int = Field(8, ge=1, le=1000)
    group_size: int = Field(1, ge=1, le=256)
    weight: float = Field(1.0, gt=0.0)
    rollout_unit: Literal["trajectory", "group"] = Field(
        "trajectory",
        description="multi-turn tasks: `trajectory` runs every episode as its own workflow, advancing on its own; "
        "`group` plays a GRPO group in lockstep in one env session, one batched activity per turn (8x fewer "
        "activities for groups of 8; a slow member holds its group back). Single-turn tasks always run as groups.",
    )

    faults: FaultModel | None = Field(None, description="inject env latency and failures (see FaultModel)")
    reset_pool_size: int = Field(
        0,
        ge=0,
        le=64,
        description="pre-reset envs each cpu worker keeps per (env, args, seed): a reset takes a ready one at once; "
        "otherwise it starts max(1, size) resets of the seed at once (hedged), answers with the first to succeed and "
        "keeps the others for the next reset of that seed (the other members of a GRPO group). 0: one reset, no pool.",
    )
    reset_timeout_s: float | None = Field(
        None, gt=0.0, description="per-reset timeout on the worker (default: the env's declared reset_timeout)"
    )
    env_pool: PoolName | None = Field(
        None,
        description="the pool whose workers hold this task's env sessions; filled from the env's "
        "`@env(pool=...)` when the spec is loaded (None: not known where it was loaded, so cpu)",
    )
    reward_serverless: bool | None = Field(
        None,
        description="whether the reward may run on the serverless pool; filled from its "
        "`@reward(serverless=...)` when the spec is loaded (False: it runs on generate_pool whatever reward_placement "
        "says)",
    )
    reward_pool: PoolName = Field(
        Pool.SERVERLESS.value, description="the reward pool this task's rewards go to when they run serverless"
    )

    @model_validator(mode="before")
    @classmethod
    def _declared_placement(cls, data: Any) -> Any:
        """Fill `env_pool` and `reward_serverless` from the declarations, where they can be looked up.

        Not inside a workflow (nor its sandbox, where it decodes its input): workflow code must not
        import a user's modules, and the spec it gets was filled where it was loaded.
        """
        if not isinstance(data, dict) or workflow.in_workflow() or workflow.unsafe.in_sandbox():
            return data
        filled = dict(data)
        if filled.get("env_pool") is None and isinstance(filled.get("env"), str):
            filled["env_pool"] = declared_env_pool(filled["env"])
        if filled.get("reward_serverless") is None and isinstance(filled.get("reward"), str):
            filled["reward_serverless"] = declared_reward_serverless(filled["reward"])
        return filled

    @property
    def grouped(self) -> bool:
        """Whether this task's groups run as GroupRolloutWorkflows (single-turn, or `rollout_unit: group`)."""
        return self.max_turns == 1 or self.rollout_unit == "group"

    @property
    def env_queue(self) -> str:
        """The pool whose workers hold this task's env sessions (reset, restore, prompts, check go there)."""
        return self.env_pool or Pool.CPU.value

    @property
    def reward_queue(self) -> str:
        """The task queue the reward activity goes to: `reward_pool` ("serverless"), or the generation pool's
        when colocated or when the reward is declared `serverless=False`."""
        beside_generation = self.reward_placement == "colocated" or self.reward_serverless is False
        return self.generate_pool if beside_generation else self.reward_pool

    @model_validator(mode="after")
    def _one_sample_per_turn(self) -> TaskSpec:
        if self.max_turns > 1 and self.sampling.n != 1:
            raise ValueError(
                f"sampling.n is {self.sampling.n}, but a multi-turn task (max_turns {self.max_turns}) samples one "
                "completion per turn: set sampling.n to 1 and use group_size for GRPO groups"
            )
        return self


class WorkerTuning(_Strict):
    """How each worker process polls Temporal and runs workflow tasks (infra/worker_tuning.py turns it into
    `Worker` options). The defaults are the fast choice measured by `python -m bench overhead` and the
    profile in docs/benchmarks.md: with the SDK's 5 polls per queue, 64 workflows of an activity per episode
    left each workflow task ~0.5–1.5 s in the server's queue while the control worker sat mostly idle, and
    the strict sandbox costs the control worker twice the CPU per workflow run."""

    workflow_task_pollers: int = Field(32, ge=2, le=500)
    """Concurrent workflow-task polls of the control worker (sticky and non-sticky together; the SDK's is 5)."""
    activity_task_pollers: int = Field(32, ge=1, le=500)
    """Concurrent activity-task polls per queue of an activity worker (the SDK's is 5)."""
    max_cached_workflows: int = Field(1000, ge=1)
    """Workflows the control worker keeps in memory (sticky execution): at least the workflows in flight, or
    each workflow task of an evicted one replays its whole history."""
    max_concurrent_workflow_tasks: int = Field(200, ge=2)
    sandbox: Literal["strict", "off"] = "off"
    """`strict`: the SDK's sandbox, which re-imports each workflow's module for every run and checks calls made
    from it; `off`: workflows run unsandboxed (half the control worker's CPU per workflow run). rollart's
    workflow logic lives in passed-through modules (workflows/driver) that the sandbox never checked;
    determinism is guarded by the replay tests (tests/test_replay.py, under both) and the import contracts."""


class TracingConfig(_Strict):
    """OpenTelemetry traces of workflows and activities (`temporal.tracing`), through temporalio's contrib
    `TracingInterceptor`: every process that connects exports spans over OTLP to `endpoint` (a collector, Jaeger,
    Tempo, ...), tagged with its `service_name` and host."""

    endpoint: str = Field(
        ...,
        pattern=r"^https?://[^\s/]+(/.*)?$",
        description="the collector's OTLP address: http://HOST:4317 (gRPC) or http://HOST:4318 (HTTP)",
    )
    protocol: Literal["grpc", "http"] = "grpc"
    service_name: str = Field("rollart", min_length=1, max_length=128)


class TemporalTLS(_Strict):
    """TLS to the Temporal server (`temporal.tls`): the CA that vouches for the server, and this client's certificate
    for a server that asks for one (mTLS).

    `tls: {}` (or `tls: true`) is TLS with this machine's trusted roots and no client certificate. The files are
    read when a process connects (relative paths from its working directory), not when the spec is loaded: a job
    rendered for Kubernetes names the paths inside the pods (`rollart k8s render` rewrites them).
    """

    ca: Path | None = Field(
        None,
        description="PEM file of the CA that signed the server's certificate (default: this machine's trusted roots)",
    )
    cert: Path | None = Field(None, description="PEM file of this client's certificate (mTLS), with `key`")
    key: Path | None = Field(None, description="PEM file of the private key of `cert`")
    server_name: str | None = Field(
        None,
        min_length=1,
        max_length=253,
        pattern=r"^[A-Za-z0-9_.\-]+$",
        description="the name the server's certificate must carry, also sent as SNI (default: the host of "
        "temporal.address)",
    )

    @model_validator(mode="after")
    def _cert_with_key(self) -> TemporalTLS:
        if (self.cert is None) != (self.key is None):
            given, missing = ("cert", "key") if self.cert is not None else ("key", "cert")
            raise ValueError(
                f"tls.{given} is set but tls.{missing} is not: a client certificate goes with its private "
                "key; set both (mTLS), or neither"
            )
        return self

    def files(self) -> dict[str, Path]:
        """The files it names, by field (`ca`, `cert`, `key`)."""
        return {
            name: path for name, path in (("ca", self.ca), ("cert", self.cert), ("key", self.key)) if path is not None
        }


class TemporalConfig(_Strict):
    """Where the Temporal server is, and how to reach it securely. `address: null` means: start the local dev server.

    `tls` and `api_key_env` are for a server named in `address` (the local dev server has no TLS); the API key
    itself never goes in the spec, only the name of the environment variable that holds it.
    """

    address: str | None = None
    tls: TemporalTLS | None = Field(None, description="TLS to the server (see TemporalTLS); null: plain gRPC")
    api_key_env: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        max_length=128,
        description="the environment variable holding an API key for the server, sent as `authorization: Bearer "
        "KEY` on every call; it turns TLS on (this machine's trusted roots unless `tls` says otherwise)",
    )
    namespace: str = "default"
    ui_port: int = Field(8233, ge=1, le=65535)
    task_queue_prefix: str = Field(
        "",
        pattern=QUEUE_PREFIX_PATTERN,
        max_length=64,
        description="prepended to every task queue the job's workflows and workers use (`team-a-` → `team-a-cpu`): "
        "jobs sharing one server with their own workers keep them apart",
    )
    worker_heartbeat_s: float = Field(
        5.0,
        ge=1.0,
        le=60.0,
        description="how often each worker tells the server it is alive (Temporal's worker heartbeats): the stall "
        "checks tell a dead pool from a busy one by them, within a few of these",
    )
    max_pending_children: int = Field(
        2000,
        ge=1,
        description="child workflows one workflow may have running on this server (its "
        "`limit.numPendingChildExecutions.error`; 2,000 is Temporal's default, and the local dev server is started "
        "with this value). With trajectory rollout every episode is a child of the training workflow, so a job "
        "whose (async_bound + 1) x batch_size exceeds it is refused when it is loaded: past the limit the server "
        "refuses every start and the job would hang",
    )
    workers: WorkerTuning = Field(default_factory=WorkerTuning)
    tracing: TracingConfig | None = Field(
        None, description="OpenTelemetry traces of workflows and activities (see TracingConfig); null: none"
    )

    @field_validator("tls", mode="before")
    @classmethod
    def _tls_switch(cls, value: Any) -> Any:
        """`tls: true` is TLS with the trusted roots (`tls: {}`); `tls: false` is none."""
        if value is True:
            return {}
        return None if value is False else value

    @property
    def secured(self) -> bool:
        """Whether connections to the server use TLS (set explicitly, or turned on by an API key)."""
        return self.tls is not None or self.api_key_env is not None

    def without_security(self) -> TemporalConfig:
        """These settings without TLS and API key: for the local dev server, which has neither."""
        return self.model_copy(update={"tls": None, "api_key_env": None})


class MooncakeConfig(_Strict):
    """How a process reaches Mooncake Store: the master, the transport, and the memory it lends or borrows.

    `master: null` means the local stack starts one (`rollart up` / `rollart train`) on free ports and
    hands its address to every worker; `rollart worker` needs an address (`--store-master HOST:PORT`).
    Objects live in the *global segments* that processes contribute: by default only the store keeper
    (Mooncake's `mooncake_client`, started beside the master) does, so workers may come and go without
    taking data with them (`segment_mib: 0`).
    """

    master: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]+:[0-9]{1,5}$")
    host: str = Field("127.0.0.1", min_length=1)
    protocol: Literal["tcp", "rdma"] = "tcp"
    rdma_devices: str = ""
    segment_mib: int = Field(0, ge=0)
    keeper_segment_mib: int = Field(1024, ge=16)
    buffer_mib: int = Field(64, ge=4)
    retry_after_s: float = Field(10.0, gt=0)
    lease_s: float = Field(
        10.0,
        gt=0,
        description="how long each read holds an object against removal (the master's default_kv_lease_ttl): "
        "an old weight version read moments ago outlives the publish that retires it by up to this long; "
        "only for the master the local stack starts",
    )


class StoreConfig(_Strict):
    """Where bulk data (tokens, logprobs, large payloads, published weights) lives.

    `local` is a directory (`path`) every worker shares. `mooncake` is Mooncake Store (TCP here, RDMA on
    a cluster) — a cache, not storage: with `fallback: local` (the default) every write also lands in
    `path`, and a read that Mooncake cannot serve (master down, key evicted) comes from there; with
    `fallback: none` such a read is an error naming the key. `keep_weight_versions` published weight
    versions per job stay in the store; older ones are removed as the trainer publishes new ones.
    """

    kind: Literal["local", "mooncake"] = "local"
    path: Path = DEFAULT_HOME / "store"
    payload_threshold_bytes: int = Field(256 * 1024, ge=1024, le=1536 * 1024)
    fallback: Literal["local", "none"] = "local"
    keep_weight_versions: int = Field(2, ge=1)
    mooncake: MooncakeConfig = Field(default_factory=MooncakeConfig)

    def with_master(self, address: str) -> StoreConfig:
        """This config pointed at the Mooncake master `address` (HOST:PORT)."""
        mooncake = {**self.mooncake.model_dump(), "master": address}
        return StoreConfig.model_validate({**self.model_dump(), "mooncake": mooncake})


class EngineConfig(_Strict):
    """The inference engine of a generation worker.

    `kv_cache_gib` sizes the KV cache on CPUs (vLLM's CPU backend); on GPUs `gpu_memory_utilization`
    does (the share of each GPU's memory vLLM may take, weights included). `tensor_parallel_size`
    GPUs serve one engine (a generation worker then needs that many GPUs: `rollart k8s render`
    requests them). `dtype` is the engine's compute dtype; weights published in float32 are cast on
    load.
    """

    kind: Literal["vllm", "hf"] = "vllm"
    max_model_len: int = Field(512, ge=16)
    max_num_seqs: int = Field(128, ge=1)
    kv_cache_gib: float = Field(1.0, gt=0)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    tensor_parallel_size: int = Field(1, ge=1, le=64)
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    enable_prefix_caching: bool = True
    seed: int = 0


class TaskEnv(_Strict):
    """A task's env as the trainer needs it to read actions: its registered name or import path, and its args."""

    env: str = Field(min_length=1)
    env_args: dict[str, Any] = Field(default_factory=dict)


class LossConfig(_Strict):
    """The policy loss: GRPO advantages with PPO-clip, corrected for stale (off-policy) data.

    `decoupled` (AReaL): the clip is taken against the trainer's own proximal policy π_prox (its
    weights before this step), and tokens are weighted by π_prox/π_behav, where π_behav is the
    engine's logprob when it sampled. `tis_cap` truncates that weight (token-level truncated
    importance sampling); without `decoupled` the ratio is taken against π_behav directly.
    """

    clip_eps: float = Field(0.2, gt=0.0, lt=1.0)
    clip_eps_high: float | None = Field(None, gt=0.0)
    """The clip's upper side, 1 + `clip_eps_high` (DAPO's clip-higher, e.g. 0.28); None: symmetric, 1 + `clip_eps`.
    A wider upper side lets a rare token that earned a positive advantage gain more per update, which slows the
    collapse of entropy onto the first route that pays."""
    tis_cap: float | None = Field(2.0, gt=1.0)
    decoupled: bool = True
    kl_coef: float = Field(0.0, ge=0.0)
    entropy_coef: float = Field(0.0, ge=0.0)
    """The entropy bonus's weight; with `entropy_target`, its starting value."""
    entropy_target: float | None = Field(None, gt=0.0)
    """Adaptive entropy control (Skywork-OR1): after each step whose mean token entropy was below this, the
    bonus's weight rises by `entropy_coef_step` (up to `entropy_coef_max`); after one above, it falls by as much
    (down to 0). The policy may still sharpen, but a collapse onto a wrong deterministic answer, where every
    group scores alike and so no advantage is left to correct it, meets a growing push back. The weight is part
    of the job's state (workflows/entropy_control.py): a retried or resumed step uses the same."""
    entropy_coef_step: float = Field(0.001, gt=0.0)
    entropy_coef_max: float = Field(0.01, gt=0.0)
    entropy_over: Literal["tokens", "actions"] = "tokens"
    """What the entropy bonus (and `entropy_target`) measures at each generated token. `tokens`: the entropy of
    the next-token distribution over the whole vocabulary. `actions`: the entropy of the *env's action* that
    token would be: tokens are grouped by what the task's env reads in them (`Env.action_of`, e.g. FrozenLake's
    L/D/R/U) and the distribution over those groups, among the tokens that are actions, is what is measured. A
    bonus on it keeps a policy trying other moves once it settles on a route, without the push a vocabulary-wide
    bonus gives towards the many tokens that are no action. It fits envs whose action is a single token
    (`max_tokens: 1`); each step then reports `action_entropy` (or `action_coverage`, see `action_bonus`) in place
    of `entropy`. Every task's env must declare its actions."""
    action_bonus: Literal["entropy", "coverage"] = "entropy"
    """With `entropy_over: actions`, the bonus's form. `entropy`: H(q) over the actions. `coverage`: the mean log
    probability of the actions plus log(#actions), −KL(uniform ‖ q): its pull on an action does not fade as the
    action's probability goes to 0 (the entropy's does, as q log q → 0), so every move keeps a share of about
    `entropy_coef` / (#actions × |its advantage|) that advantages alone cannot take away. Reported as
    `action_coverage` (0 when all actions are equally likely, negative otherwise)."""
    bonus_on: Literal["all", "unsolved"] = "all"
    """Which sequences the entropy bonus acts on. `all`: every one. `unsolved`: only those of groups in which no
    member succeeded: exploration where a task is not solved yet, while a group that succeeds is left to its
    advantages. With `all`, a solved policy whose groups all succeed (so every advantage is 0) is pushed back
    towards uniform by the bonus alone until it breaks (FrozenLake at 0.97 success fell to 0 within 3 steps:
    docs/learning.md). Each step reports the share of sequences under the bonus as `bonus_share`."""
    aggregation: Literal["token_mean", "seq_mean", "constant"] = "token_mean"
    """How per-token terms become the batch's loss. `token_mean` (DAPO): every completion token of the batch
    weighs the same, so long answers weigh more. `seq_mean`: every sequence weighs the same, shared by its
    tokens. `constant` (Dr. GRPO): token sums divided by sequences × `constant_tokens`, so a token's weight
    depends on neither its sequence's length nor the batch's. Metrics other than the losses stay token means."""
    constant_tokens: int = Field(1024, ge=1)
    """`aggregation: constant`'s per-sequence normaliser (Dr. GRPO uses the generation's max tokens)."""
    normalize_advantage_std: bool = True
    """GRPO advantages divided by their group's reward std (GRPO); False keeps the raw difference from the
    group mean (Dr. GRPO), which does not up-weight groups whose rewards barely differ."""
    advantage_std_floor: float = Field(0.0, ge=0.0)
    """With `normalize_advantage_std`, the group std is taken as at least this: a group whose rewards differ by
    less (one member straying a little from a route all the others follow) gets advantages in proportion, not
    blown up to ±1 std. E.g. 0.1 for rewards on a 0–1 scale; 0: plain GRPO."""

    @model_validator(mode="after")
    def _coverage_is_over_actions(self) -> LossConfig:
        if self.action_bonus == "coverage" and self.entropy_over != "actions":
            raise ValueError("action_bonus: coverage is a bonus over the env's actions: set entropy_over: actions")
        if self.action_bonus == "coverage" and self.entropy_target is not None:
            raise ValueError(
                "entropy_target controls an entropy: use it with action_bonus: entropy, or set a "
                "fixed entropy_coef for coverage"
            )
        return self

    @model_validator(mode="after")
    def _entropy_start_within_its_cap(self) -> LossConfig:
        if self.entropy_target is not None and self.entropy_coef > self.entropy_coef_max:
            raise ValueError(
                f"entropy_coef ({self.entropy_coef}) is the adaptive weight's start: it must not exceed "
                f"entropy_coef_max ({self.entropy_coef_max})"
            )
        return self


class ParallelConfig(_Strict):
    """How the megatron trainer splits its work over ranks: `tensor` (T) ranks share each layer, `data` (D)
    groups of them train on different sequences of the batch. T × D ranks in all, on one or more nodes."""

    tensor: int = Field(1, ge=1, le=64)
    data: int = Field(1, ge=1, le=4096)
    pipeline: int = Field(1, ge=1, description="not supported yet: must be 1")

    @field_validator("pipeline")
    @classmethod
    def _no_pipeline_yet(cls, pipeline: int) -> int:
        if pipeline != 1:
            raise ValueError(
                f"pipeline parallelism is not supported yet (got {pipeline}); use tensor and data parallelism, "
                "e.g. parallel: {tensor: 8, data: 4}"
            )
        return pipeline

    @property
    def world_size(self) -> int:
        """Ranks the trainer runs: tensor × data."""
        return self.tensor * self.data


class LRScheduleConfig(_Strict):
    """How the learning rate moves over training steps: a linear warm-up to `trainer.lr` over `warmup_steps`,
    then `constant`, or a `cosine` decay to `min_ratio` × lr over `decay_steps` (default: the rest of
    `training.steps`, filled in by the job's training plan). The rate is a function of the step number alone
    (activities/training/lr_schedule.py), so a resumed trainer or a continued job picks it up where it was."""

    kind: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    decay_steps: int | None = Field(None, ge=1)
    min_ratio: float = Field(0.0, ge=0.0, le=1.0)


class TrainerConfig(_Strict):
    """The trainer: backend, parallel layout, device and precision, optimizer and checkpoints.

    `backend: torch` trains a transformers model in the trainer worker's own process (one device).
    `backend: megatron` builds a megatron-core GPTModel from the same HF checkpoint and trains it on
    `parallel.tensor × parallel.data` rank processes that the trainer worker starts (gloo on CPUs,
    NCCL on GPUs); weights are published as HF safetensors either way. `device: auto` is cuda when a
    GPU is visible, else cpu, so one job file serves a laptop and a GPU cluster. `dtype: bfloat16`
    computes in bf16 with float32 master weights and optimizer state. AdamW with gradient
    accumulation over micro-batches of `micro_batch_size` sequences (per data-parallel rank).
    `mini_batches` × `ppo_epochs` optimizer updates per train step (PPO): the batch is cut into
    `mini_batches` parts and passed over `ppo_epochs` times; the clip against the proximal policy (the
    weights before the step's first update) engages from the second update on.
    """

    backend: Literal["torch", "megatron"] = "torch"
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["float32", "bfloat16"] = "float32"
    activation_checkpointing: bool = False
    lr: float = Field(1e-3, gt=0.0)
    lr_schedule: LRScheduleConfig = Field(default_factory=LRScheduleConfig)
    betas: tuple[float, float] = (0.9, 0.99)
    eps: float = Field(1e-8, gt=0.0)
    weight_decay: float = Field(0.0, ge=0.0)
    grad_clip: float = Field(1.0, gt=0.0)
    micro_batch_size: int = Field(64, ge=1)
    mini_batches: int = Field(1, ge=1, le=1024, description="optimizer updates per pass over a train batch")
    ppo_epochs: int = Field(1, ge=1, le=64, description="passes over each train batch")
    checkpoint_every: int = Field(50, ge=1)
    seed: int = 0
    loss: LossConfig = Field(default_factory=LossConfig)

    task_envs: dict[str, TaskEnv] = Field(
        default_factory=dict,
        description="filled by the training plan with `loss.entropy_over: actions`: each "
        "task's env, whose actions the trainer groups tokens by",
    )

    def over(self, steps: int) -> TrainerConfig:
        """This config for a run of `steps` training steps: a cosine schedule without `decay_steps` decays
        over the steps left after its warm-up."""
        schedule = self.lr_schedule
        if schedule.kind != "cosine" or schedule.decay_steps is not None:
            return self
        decay = max(1, steps - schedule.warmup_steps)
        return self.model_copy(update={"lr_schedule": schedule.model_copy(update={"decay_steps": decay})})

    def with_task_envs(self, tasks: Sequence[TaskSpec]) -> TrainerConfig:
        """This config with `task_envs` filled when the loss measures entropy over actions (else unchanged, so
        other jobs' histories carry nothing new)."""
        if self.loss.entropy_over != "actions":
            return self
        envs = {t.name: TaskEnv(env=t.env, env_args=t.env_args) for t in tasks}
        return self.model_copy(update={"task_envs": envs})

    @model_validator(mode="after")
    def _parallel_needs_megatron(self) -> TrainerConfig:
        if self.backend == "torch" and self.parallel.world_size > 1:
            raise ValueError(
                f"parallel: tensor {self.parallel.tensor} x data {self.parallel.data} needs backend: megatron "
                "(the torch backend trains in one process on one device)"
            )
        return self


class StallConfig(_Strict):
    """When the job calls itself stalled, and whether it then gives up (`training.stall`).

    Every `check_every_s` the training workflow reads the backlog, the pollers and the worker heartbeats of
    the queues its tasks use. A queue with work waiting and no sign of a live worker (a current heartbeat
    or a poll) for `no_worker_after_s` is a stall on that pool; so is no trajectory finishing for
    `no_progress_factor` × the recent median interval between finishes (at least `no_progress_min_s`)
    while some are in flight. With `fail_after_s` a stall that lasts that long
    ends the job with an error naming the pool; without it the job waits, and resumes when a worker appears.
    """

    enabled: bool = True
    check_every_s: float = Field(15.0, gt=0.0)
    no_worker_after_s: float = Field(30.0, ge=0.0)
    no_progress_factor: float = Field(10.0, gt=1.0)
    no_progress_min_s: float = Field(60.0, ge=0.0)
    fail_after_s: float | None = Field(None, gt=0.0)
    history_events_max: int = Field(
        10_000,
        ge=100,
        description="while stalled, continue-as-new once the run's "
        "history has this many events (a long stall adds ~11 per check)",
    )


class DynamicSamplingConfig(_Strict):
    """Groups whose rewards are all equal give GRPO no gradient: drop them before they enter a batch
    (`training.dynamic_sampling`; `true` / `false` is short for `{enabled: ...}`).

    Filtered trajectories free their admission slots at once, so new groups refill the batch (DAPO's
    dynamic sampling with refill); `oversample` keeps that share more in flight so a full batch
    usually survives the filter without waiting for a refill round. When more than `max_filtered_batches`
    batches' worth were filtered since the last step (a policy that solves, or fails, everything), groups
    are kept again until that step: the job goes on instead of waiting forever.
    """

    enabled: bool = False
    oversample: float = Field(0.25, ge=0.0, le=4.0, description="extra in flight, as a share of the admission limit")
    max_filtered_batches: float = Field(4.0, gt=0.0)

    @model_validator(mode="before")
    @classmethod
    def _on_or_off(cls, value: Any) -> Any:
        return {"enabled": value} if isinstance(value, bool) else value


class WandbConfig(_Strict):
    """Weights & Biases export (`metrics.wandb`; `true` / `false` is short for `{enabled: ...}`).

    Needs `pip install wandb`.

    `mode: offline` (the default) writes the run under the run dir's `wandb/` with no network; `wandb sync` uploads it.
    """

    enabled: bool = False
    project: str = Field("rollart", min_length=1)
    entity: str | None = None
    mode: Literal["offline", "online"] = "offline"

    @model_validator(mode="before")
    @classmethod
    def _on_or_off(cls, value: Any) -> Any:
        return {"enabled": value} if isinstance(value, bool) else value


class MetricsConfig(_Strict):
    """Where the training client exports each step's metrics besides `metrics.jsonl` (`metrics`).

    `tensorboard`: event files in the run dir's `tensorboard/` (`tensorboard --logdir runs/`); `wandb`: a W&B run.
    """

    tensorboard: bool = True
    wandb: WandbConfig = WandbConfig()


class StopWhen(_Strict):
    """End the job once it has learned (`training.stop_when`); `training.steps` stays the cap.

    The measure is each train step's success as the progress bar shows it (`StepRecord.played_success`):
    the share of successful episodes among all the policy played for that step, that is its batch plus the
    groups dynamic sampling left out since the step before (without dynamic sampling: the batch). Episodes
    that failed for infrastructure reasons, and groups dropped as too stale, are not counted. The job ends
    after the first step whose success, and that of the `steps` − 1 steps before it, is at or above
    `success`; a step below starts the count again. It ends as at its last step: that step's weights are
    published (as every step's are), the episodes still in flight are cancelled and counted.
    """

    success: float = Field(description="the success to hold, a share in (0, 1]: 0.95 is 95 % of the episodes")
    steps: int = Field(ge=1, description="for this many consecutive train steps")

    @field_validator("success")
    @classmethod
    def _a_share(cls, value: float) -> float:
        if not 0.0 < value <= 1.0:
            hint = f" (did you mean {value / 100:g}?)" if 1.0 < value <= 100.0 else ""
            raise ValueError(f"success is a share of the episodes in (0, 1], e.g. 0.95, got {value:g}{hint}")
        return value

    def describe(self) -> str:
        """ "success ≥ 0.95 held for 20 steps" """
        return f"success ≥ {self.success:g} held for {self.steps} step{'s' if self.steps != 1 else ''}"


class TrainingConfig(_Strict):
    """The loop: how many steps, how big, how stale data may be, and how trajectories are rolled out.

    `async_bound` k: a trajectory may be trained on at step s only if s − (the oldest policy version
    it used) ≤ k; 0 is synchronous on-policy training. `rollout_mode: batch` is the lockstep
    baseline (all resets, then all generations, then all steps, turn by turn). `stop_when` ends the job
    before `steps` once its success has held (`StopWhen`).
    """

    steps: int = Field(100, ge=1)
    batch_size: int = Field(64, ge=1)
    async_bound: int = Field(1, ge=0)
    rollout_mode: Literal["trajectory", "batch"] = "trajectory"
    continue_as_new_every: int = Field(20, ge=1)
    seed: int = 0
    stall: StallConfig = StallConfig()
    dynamic_sampling: DynamicSamplingConfig = DynamicSamplingConfig()
    stop_when: StopWhen | None = Field(
        None,
        description="end the job early once each step's training success (what the progress bar shows: the "
        "batch and the groups filtered since the step before) has been ≥ `success` for `steps` consecutive steps; "
        "None: train all `steps`",
    )

    @property
    def in_flight_limit(self) -> int:
        """Admission: trajectories in flight plus buffered, at most (async_bound + 1) × batch_size, more by
        `dynamic_sampling.oversample` when groups are filtered."""
        limit = (self.async_bound + 1) * self.batch_size
        if self.dynamic_sampling.enabled:
            limit += math.ceil(limit * self.dynamic_sampling.oversample)
        return limit


def check_batches_hold_groups(training: TrainingConfig, tasks: list[TaskSpec]) -> None:
    """A batch is built from whole GRPO groups, so every task's group_size must divide training.batch_size."""
    bad = [
        f"tasks.{i} ({t.name}) group_size {t.group_size}"
        for i, t in enumerate(tasks)
        if training.batch_size % t.group_size
    ]
    if bad:
        raise ValueError(
            f"training.batch_size {training.batch_size} is not a multiple of {', '.join(bad)}: a batch holds whole "
            "GRPO groups"
        )


OPENENV = "openenv"
"""The env that reaches an OpenEnv server; a task of it may name one of the job's `env_servers` (`env_args.server`)."""


class EnvServerSpec(_Strict):
    """An env server the job runs beside its workers: a rollart env served as an OpenEnv server (`rollart env-server`).

    The local stack starts one process per entry on `port` (loopback) and restarts it when it dies; `rollart k8s
    render` makes each a Deployment and a Service. A task reaches it with `env: openenv` and `env_args: {server:
    NAME}`, which fills the task's `base_url` with this server's `url` (default `http://127.0.0.1:PORT`, the local
    stack's; in the pods, the Service's address).
    """

    name: str = Field(
        min_length=1,
        max_length=30,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="lower-case letters, digits and '-': it names the Kubernetes Deployment and Service",
    )
    env: str = Field(
        "frozenlake", min_length=1, description="the rollart env it serves (a registered name or import path)"
    )
    env_args: dict[str, Any] = Field(default_factory=dict)
    port: int = Field(ge=1, le=65535, description="where it listens (and its Service's port on Kubernetes)")
    max_sessions: int = Field(256, ge=1, description="concurrent sessions at most: one per episode in flight")
    url: str | None = Field(
        None,
        pattern=r"^(http|https|ws|wss)://[^/\s]+$",
        description="how the workers reach it (default http://127.0.0.1:PORT, the local stack's)",
    )

    @property
    def local_url(self) -> str:
        """Where the local stack's process listens."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The URL the job's `openenv` tasks are given."""
        return self.url or self.local_url

    def command(self, host: str) -> list[str]:
        """The `rollart env-server` command line serving it on `host` (the local stack's process, a pod's container)."""
        return [
            "rollart",
            "env-server",
            "--env",
            self.env,
            "--env-args",
            json.dumps(self.env_args, sort_keys=True),
            "--host",
            host,
            "--port",
            str(self.port),
            "--max-sessions",
            str(self.max_sessions),
        ]


def _resolve_env_servers(data: Any) -> Any:
    """Before validation, fill `base_url` of every `openenv` task naming one of `env_servers` (`env_args.server`)."""
    if not isinstance(data, dict) or not isinstance(data.get("tasks"), list):
        return data
    servers: dict[str, str] = {}
    for i, server in enumerate(data.get("env_servers") or []):
        try:
            spec = EnvServerSpec.model_validate(server)
        except ValidationError:  # reported, naming its fields, when the field itself is validated
            continue
        if spec.name in servers:
            raise ValueError(f"env_servers.{i}: name {spec.name!r} is used twice; each env server needs its own name")
        servers[spec.name] = spec.base_url
    tasks = []
    for i, task in enumerate(data["tasks"]):
        args = task.get("env_args") if isinstance(task, dict) else None
        if not isinstance(args, dict) or task.get("env") != OPENENV or "server" not in args:
            tasks.append(task)
            continue
        name = args["server"]
        if name not in servers and any(
            isinstance(v, dict) and v.get("name") == name for v in data.get("env_servers") or []
        ):
            tasks.append(task)  # that server's own fields do not validate: its errors say why
            continue
        if name not in servers:
            known = ", ".join(sorted(servers)) or "none: add an env_servers section"
            raise ValueError(f"tasks.{i}.env_args.server: no env server {name!r} in env_servers (defined: {known})")
        if args.get("base_url") not in (None, servers[name]):
            raise ValueError(
                f"tasks.{i}.env_args: give base_url or server, not both (server {name!r} is at "
                f"{servers[name]}, base_url says {args['base_url']!r})"
            )
        tasks.append({**task, "env_args": {**args, "base_url": servers[name]}})
    return {**data, "tasks": tasks}


class JobSpec(_Strict):
    """A whole job. The model dir is built on first use when it is the default tiny model."""

    name: str = Field("job", min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    model_dir: Path = DEFAULT_HOME / "models" / "tiny"
    tasks: list[TaskSpec] = Field(min_length=1)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    temporal: TemporalConfig = Field(default_factory=TemporalConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    metrics: MetricsConfig = Field(
        default_factory=MetricsConfig, description="metric exporters of the training client: TensorBoard, W&B"
    )
    kubernetes: KubernetesConfig | None = Field(None, description="cluster layout for `rollart k8s render`/`apply`")
    pools: dict[PoolName, PoolSpec] = Field(
        default_factory=lambda: dict(DEFAULT_POOLS),
        description="the job's pools by name: role, GPUs and (reward pools) scaling, merged over the six "
        "defaults (control, cpu, h800, h20, serverless, trainer); see infra/pools.py",
    )
    env_servers: list[EnvServerSpec] = Field(
        default_factory=list, description="OpenEnv servers run beside the workers (see EnvServerSpec)"
    )

    @model_validator(mode="before")
    @classmethod
    def _env_server_urls(cls, data: Any) -> Any:
        return _resolve_env_servers(data)

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

    @field_validator("pools", mode="before")
    @classmethod
    def _over_the_defaults(cls, pools: Any) -> Any:
        return merge_declared(pools)

    @model_validator(mode="after")
    def _work_goes_to_declared_pools(self) -> JobSpec:
        """Every pool a task routes work to is declared with the role that work needs; control and trainer keep
        theirs (the workflows route to them by name)."""
        problems = check_fixed_roles(self.pools)
        for i, t in enumerate(self.tasks):
            routes = [
                ("generate_pool", t.generate_pool, ("generation",)),
                ("env_pool", t.env_queue, SESSION_ROLES),
                ("reward_pool", t.reward_pool, ("reward",)),
            ]
            found = [role_problem(self.pools, name, roles, f"tasks.{i}.{field}") for field, name, roles in routes]
            problems += [p for p in found if p]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _unique_task_names(self) -> JobSpec:
        names = [t.name for t in self.tasks]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"task names must be unique; repeated: {', '.join(dupes)}")
        return self

    @model_validator(mode="after")
    def _batches_hold_whole_groups(self) -> JobSpec:
        check_batches_hold_groups(self.training, self.tasks)
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
        episodes = [task.name for task in self.tasks if not task.grouped]
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
    def _pools_have_workers(self) -> JobSpec:
        problems = self.kubernetes.problems(self.needs()) if self.kubernetes is not None else []
        if problems:
            raise ValueError("kubernetes: " + "; ".join(problems))
        return self

    @model_validator(mode="after")
    def _rewards_have_workers(self) -> JobSpec:
        for i, t in enumerate(self.tasks):
            scaling = self.pools[t.reward_queue]
            if scaling.role == "reward" and scaling.max_workers == 0:
                raise ValueError(
                    f"tasks.{i} ({t.name}) places its reward on pool {t.reward_queue!r}, but pools.{t.reward_queue}"
                    f".max_workers is 0, so no worker would ever run it; raise max_workers or set "
                    "reward_placement: colocated"
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
        return is_generation(self.pools, pool) and any(t.reward_queue == pool for t in self.tasks)

    def hosts_envs(self, pool: str) -> bool:
        """Whether some task's env sessions live on `pool`'s workers (its `env_pool`)."""
        return any(t.env_queue == pool for t in self.tasks)

    def needs(self) -> JobNeeds:
        """What this job asks of a deployment (`kubernetes` checks and lays out its pools from it)."""
        routes = []
        for t in self.tasks:
            routes += [
                Route(t.name, "its env", t.env, t.env_queue),
                Route(t.name, "its generation", None, t.generate_pool),
                Route(t.name, "its reward", t.reward, t.reward_queue),
            ]
        parallel = self.trainer.parallel
        return JobNeeds(
            pools=self.pools,
            routes=tuple(routes),
            tensor_parallel_size=self.engine.tensor_parallel_size,
            trainer_tensor=parallel.tensor,
            trainer_data=parallel.data,
        )

    def task(self, name: str) -> TaskSpec:
        """The task called `name`, or a KeyError listing the ones there are."""
        for t in self.tasks:
            if t.name == name:
                return t
        raise KeyError(f"no task {name!r} in job {self.name!r}; tasks: {', '.join(t.name for t in self.tasks)}")


class JobSpecError(ValueError):
    """A job spec that cannot be read or does not validate; the message names the file and fields."""


def format_validation_error(err: ValidationError, source: str) -> str:
    """One line per problem: `source: field.path: message (got value)`."""
    lines = [f"{source}: invalid job spec ({err.error_count()} problem{'s' if err.error_count() > 1 else ''})"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        got = "" if e["type"] == "missing" else f" (got {e['input']!r})"
        if len(got) > 80:
            got = got[:77] + "...)"
        lines.append(f"  {loc}: {e['msg']}{got}")
    return "\n".join(lines)


def load_job(path: str | Path, overrides: dict[str, Any] | None = None) -> JobSpec:
    """Read a job spec from YAML (.yaml/.yml) or JSON and validate it.

    `overrides` are merged over the file's top level (for CLI flags such as
    `--temporal-address`). Relative model/store paths stay relative to the cwd.
    A job naming a cluster file (`cluster: cluster.yaml`) takes its pools from there (`_with_cluster`).
    """
    path = Path(path)
    raw = _with_cluster(_read_mapping(path, "job spec"), path)
    for key, value in (overrides or {}).items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    try:
        return JobSpec.model_validate(raw)
    except ValidationError as e:
        raise JobSpecError(format_validation_error(e, str(path))) from e


def _read_mapping(path: Path, what: str) -> dict[str, Any]:
    """The mapping a YAML (.yaml/.yml) or JSON file holds; a JobSpecError naming the file otherwise."""
    try:
        text = path.read_text()
    except OSError as e:
        raise JobSpecError(f"{path}: cannot read {what}: {e.strerror or e}") from e
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            raw = yaml.safe_load(text)
        else:
            raw = json.loads(text)
    except Exception as e:  # yaml.YAMLError / json.JSONDecodeError: both carry line numbers
        raise JobSpecError(f"{path}: not valid {'YAML' if path.suffix in ('.yaml', '.yml') else 'JSON'}: {e}") from e
    if not isinstance(raw, dict):
        raise JobSpecError(f"{path}: a {what} is a mapping at the top level, got {type(raw).__name__}")
    return raw


def _with_cluster(raw: dict[str, Any], job_path: Path) -> dict[str, Any]:
    """The job with the pools of the cluster file it names (`cluster:`, relative to the job's file) under its own.

    A cluster's pools are declared once for every job run on it; the job's `pools:` entries are laid over the
    cluster's field by field, as both are over the defaults.
    """
    if "cluster" not in raw:
        return raw
    job = dict(raw)
    path = job_path.parent / str(job.pop("cluster"))
    cluster = _read_mapping(path, "cluster file")
    if set(cluster) - {"pools"} or not isinstance(cluster.get("pools"), dict):
        raise JobSpecError(f"{path}: a cluster file holds one section, `pools:` (a mapping of pool name to pool)")
    declared = job.get("pools") or {}
    if not isinstance(declared, dict):
        return job  # not a mapping: validation says so
    pools = dict(cluster["pools"])
    for name, entry in declared.items():
        below = pools.get(name)
        pools[name] = {**below, **entry} if isinstance(below, dict) and isinstance(entry, dict) else entry
    return {**job, "pools": pools}
