"""Input, carried state, status and result of the training workflow."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollart.contracts.activities import BULK_CLAIM_BYTES, SampleRef
from rollart.contracts.generation import EnginePressure
from rollart.spec.config import (
    AUTO_POOL,
    AffinityConfig,
    JobSpec,
    PriorityPolicy,
    StopWhen,
    TaskSpec,
    TemporalLimits,
    TrainerConfig,
    TrainingConfig,
    WeightsConfig,
)
from rollart.spec.hardware import GPUS, engine_rates
from rollart.spec.pools import QUEUE_PREFIX_PATTERN

__all__ = [
    "ENGINES_KEPT",
    "AdmissionState",
    "EndedBy",
    "EngineMeter",
    "FailureRun",
    "InFlight",
    "PlacementState",
    "Stall",
    "StallWatch",
    "StepCost",
    "StepRecord",
    "TaskTokens",
    "TrainingInput",
    "TrainingPlan",
    "TrainingResult",
    "TrainingState",
    "TrainingStatus",
    "played_success",
    "stall_summary",
]

HISTORY_KEPT = 50
"""How many step records the status query returns (older ones are in the run dir's metrics.jsonl)."""

ENGINES_KEPT = 32
"""How many engines' last reports the training state keeps (the most recent; workers come and go)."""


class TaskTokens(BaseModel):
    """One task's trajectories in a step's batch and their generation tokens: the profile automatic affinity
    plans on (spec/placement.py). `uncached_prompt`: the prompt tokens a prefix cache would not hold."""

    trajectories: int = 0
    prompt: int = 0
    uncached_prompt: int = 0
    completion: int = 0

    def add(self, prompt: int, uncached_prompt: int | None, completion: int) -> None:
        """One more trajectory; without an uncached count (recorded before there was one) its whole prompt."""
        self.trajectories += 1
        self.prompt += prompt
        self.uncached_prompt += prompt if uncached_prompt is None else uncached_prompt
        self.completion += completion


class StepRecord(BaseModel):
    """One train step as the progress bar, metrics.jsonl and the plots see it."""

    step: int
    version: int
    time: float  # workflow time (epoch seconds) when the step finished
    samples: int
    reward_mean: float
    success_rate: float
    success_sampled: float | None = None  # over the batch and the groups filtered since the last step (unbiased)
    task_success: dict[str, float] = Field(default_factory=dict)
    staleness_mean: float = 0.0
    staleness_max: int = 0
    completion_tokens: int = 0
    task_tokens: dict[str, TaskTokens] = Field(default_factory=dict)
    started: int = 0
    trained: int = 0
    dropped: int = 0
    failed: int = 0
    in_flight: int = 0
    buffered: int = 0
    filtered: int = 0
    train: dict[str, float] = Field(default_factory=dict)
    admission_cap: int | None = None  # trajectories allowed in flight by engine pressure (None: not adaptive)
    kv_usage: float | None = None  # the fullest KV cache among the engines' last reports
    preempted: int | None = None  # requests the engines preempted since they started (their last reports, summed)
    prefix_hit_rate: float | None = None  # prompt tokens found in the engines' prefix caches since they started
    placement: dict[str, str] = Field(default_factory=dict)  # where generate_pool: auto tasks generated: task → pool
    placement_plan: list[str] = Field(default_factory=list)  # the plan made after this step, and its reasons

    @property
    def played_success(self) -> float:
        """The success of what the policy played for this step (see `played_success`)."""
        return self.success_rate if self.success_sampled is None else self.success_sampled


def played_success(row: dict) -> float:
    """A step's success over everything the policy played for it: its batch and the groups dynamic sampling
    filtered out since the step before (the batch alone is biased then: all-success groups are left out).
    Rows written before the field existed give the batch's."""
    sampled = row.get("success_sampled")
    return row["success_rate"] if sampled is None else sampled


EndedBy = Literal["steps", "stop_when", "stop_signal"]
"""Why a job ended: it trained `training.steps` steps, its `training.stop_when` rule held (it learned), or it was
sent the `stop` signal."""


class Stall(BaseModel):
    """A pool with work waiting and no worker polling it, or a job in which nothing finishes: since when.

    Times are workflow time (epoch seconds): `since` when the condition was first seen (for `no_progress`,
    the last sign of progress), `seen_at` the last check that still saw it.
    """

    reason: Literal["no_worker", "no_progress"]
    pool: str | None = None
    since: float
    seen_at: float
    backlog: int = 0
    in_flight: int = 0
    reported: bool = False  # past its threshold: in the status query, the log and the UI

    def describe(self, now: float | None = None) -> str:
        """One line for people: "no worker on h800 for 60 s, 10 activities waiting"."""
        for_s = max(0.0, (self.seen_at if now is None else now) - self.since)
        if self.reason == "no_worker":
            return f"no worker on {self.pool} for {for_s:.0f} s, {self.backlog} activities waiting"
        return f"no trajectory finished for {for_s:.0f} s, {self.in_flight} in flight"


def stall_summary(stalls: list[Stall], now: float | None = None) -> str:
    """ "stalled: no worker on h800 for 60 s, 10 activities waiting; ..." or "" when nothing is stalled."""
    return "stalled: " + "; ".join(x.describe(now) for x in stalls) if stalls else ""


class StallWatch(BaseModel):
    """The stall bookkeeping the loop carries across continue-as-new (workflows/stalls.py keeps it)."""

    open: list[Stall] = Field(default_factory=list)  # conditions seen at the last check, reported or not yet
    finishes: list[float] = Field(default_factory=list)  # workflow times of the recent trajectory reports
    active_at: float = 0.0  # the last sign of progress: a trajectory reported or a step trained

    @property
    def stalls(self) -> list[Stall]:
        return [x for x in self.open if x.reported]


class AdmissionState(BaseModel):
    """The adaptive admission cap's bookkeeping (workflows/training/pressure.py), carried across continue-as-new."""

    cap: float | None = None  # trajectories that may be in flight (None: not moved yet, the async bound's cap)
    round_done: int = 0  # trajectories finished in this round (a cap's worth ends it)
    round_preempted: int = 0  # requests the engines preempted in this round
    round_full: bool = False  # an engine reported its KV cache full with requests waiting in this round
    cuts: int = 0  # times it was cut
    engines: dict[str, EnginePressure] = Field(default_factory=dict)  # each engine's last report, by worker


class EngineMeter(BaseModel):
    """One engine's last report (its rate counts are what placement reads), and the pool it serves."""

    pool: str
    counts: EnginePressure


class PlacementState(BaseModel):
    """Where `generate_pool: auto` tasks generate now, and why (workflows/training/placement.py keeps it)."""

    assignment: dict[str, str] = Field(default_factory=dict)  # auto task → generation pool
    planned_at: int | None = None  # the step of the last plan; None: the first spread, before any profile
    plans: int = 0  # plans made (kept or not)
    moves: int = 0  # plans that moved a task
    reasons: list[str] = Field(default_factory=list)  # the last plan's, in words
    makespan_s: float | None = None  # the last plan's predicted generation seconds per step
    rates: dict[str, tuple[int, float, float]] = Field(default_factory=dict)  # pool → (engines, prefill, decode)
    engines: dict[str, EngineMeter] = Field(default_factory=dict)  # recent engines' last counts, by worker
    seen: dict[str, list[str]] = Field(default_factory=dict)  # pool → the engines that reported since the last plan
    pool_engines: dict[str, int] = Field(default_factory=dict)  # pool → its engines at the last plan
    finished: dict[str, TaskTokens] = Field(default_factory=dict)  # task → what finished since the last plan
    since_step: int = 0  # the step of the last plan (0: the job's start): `finished` is over the steps since

    def describe(self) -> str:
        """One line: "placement (step 10): arith → h20, maze → h800; 2.31 s of generation per step"."""
        when = "initial spread" if self.planned_at is None else f"step {self.planned_at}"
        where = ", ".join(f"{t} → {p}" for t, p in sorted(self.assignment.items()))
        predicted = f"; {self.makespan_s:.3g} s of generation per step" if self.makespan_s is not None else ""
        return f"placement ({when}): {where}{predicted}"


class InFlight(BaseModel):
    """A running trajectory: its GRPO group and the workflow that runs it (a lockstep batch runs many)."""

    group: str
    workflow: str


class FailureRun(BaseModel):
    """Trajectories failing in a row for one reason no retry can cure, none completed since (`failing.py`)."""

    error_type: str
    error: str  # the latest one's message
    count: int


class StepCost(BaseModel):
    """What one train step cost a run of the training workflow: its history between steps (launches, reports,
    workflow tasks; the state it was carried in left out) and the signals it took (workflows/training/
    continuation.py projects the next step from the costs of the last runs)."""

    events: float = 0.0
    bytes: float = 0.0
    signals: float = 0.0


class TrainingState(BaseModel):
    """Everything the loop needs to go on; carried across continue-as-new.

    The ledger always balances: started = trained + dropped + filtered + failed + in flight + buffered.
    """

    step: int = 0
    next_group: int = 0
    started: int = 0
    trained: int = 0
    dropped: int = 0
    filtered: int = 0  # members of zero-variance groups left out (training.dynamic_sampling)
    filtered_since_step: int = 0
    filtered_successes_since_step: int = 0
    failed: int = 0
    duplicates_ignored: int = 0
    restores: int = 0  # env sessions moved to another worker because theirs died (trajectories not lost)
    engine_moves: int = 0  # turns served by another engine than the trajectory's turn before (see engine.affinity)
    admission: AdmissionState = Field(default_factory=AdmissionState)
    placement: PlacementState | None = None  # tasks with generate_pool: auto (None: the job has none)
    task_turns: dict[str, float] = Field(default_factory=dict)  # each task's recent mean turns (priority: predicted)
    in_flight: dict[str, InFlight] = Field(default_factory=dict)  # trajectory id → where it runs
    unfinished: dict[str, int] = Field(default_factory=dict)  # group id → members still running
    buffer: list[SampleRef] = Field(default_factory=list)
    ready_groups: list[str] = Field(default_factory=list)  # complete groups, in completion order
    history: list[StepRecord] = Field(default_factory=list)
    paused: bool = False
    stop_requested: bool = False
    started_at: float = 0.0
    stall: StallWatch = Field(default_factory=StallWatch)
    entropy_coef: float | None = (
        None  # the adaptive entropy weight of the next step (loss.entropy_target); None: as configured
    )
    stop_held: int = 0  # consecutive steps, the last included, whose success met training.stop_when (0 without one)
    ended_by: EndedBy | None = None  # why the job ends: set when the stop rule holds, else at the end; None: running
    failing: FailureRun | None = None  # the current run of non-retryable failures (training.fail_after_failures)
    step_costs: list[StepCost] = Field(default_factory=list)  # the last runs' that stepped, newest last

    @property
    def ledger_balanced(self) -> bool:
        return self.started == (
            self.trained + self.dropped + self.filtered + self.failed + len(self.in_flight) + len(self.buffer)
        )


class TrainingPlan(BaseModel):
    """What the training loop needs of a job: its tasks, the loop, the trainer, the model and its queues.

    Not the engine (but its `affinity`, which the rollouts route by), store, Temporal or Kubernetes sections:
    those are for workers and clients, and would only swell every history the job writes. Taken from a
    validated job (`of`), so it holds the job's rules (batches of whole groups, ...) without checking them again.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    tasks: list[TaskSpec] = Field(min_length=1)
    training: TrainingConfig
    trainer: TrainerConfig
    model_dir: str
    queue_prefix: str = Field("", pattern=QUEUE_PREFIX_PATTERN)
    weights: WeightsConfig = Field(default_factory=WeightsConfig)
    affinity: AffinityConfig = Field(default_factory=AffinityConfig)
    """Which engine serves a trajectory's turns (the job's `engine.affinity`), for the rollouts it starts."""
    priority: PriorityPolicy = "fifo"
    """How the rollouts' requests rank among those waiting on an engine (the job's `engine.priority`)."""
    placement_pools: list[str] = Field(default_factory=list)
    """The generation pools `generate_pool: auto` tasks may go to (empty: the job has none)."""
    placement_rates: dict[str, tuple[float, float]] = Field(default_factory=dict)
    """A pool's (prefill, decode) tokens/s per engine until its engines report: given, or its GPU's roofline."""
    placement_engines: dict[str, int] = Field(default_factory=dict)
    """A pool's engines at least (`training.placement.engines`, else its kubernetes replicas; absent: 1)."""
    limits: TemporalLimits = Field(default_factory=TemporalLimits)
    """The server's per-workflow limits (the job's `temporal.limits`): when a run continues as new."""

    @classmethod
    def of(cls, job: JobSpec) -> TrainingPlan:
        """The plan of a (validated) job spec."""
        trainer = job.trainer.over(job.training.steps).with_task_envs(job.tasks)
        auto = any(t.generate_pool == AUTO_POOL for t in job.tasks)
        return cls(
            tasks=job.tasks,
            training=job.training,
            trainer=trainer,
            model_dir=str(job.model_dir),
            queue_prefix=job.temporal.task_queue_prefix,
            weights=job.weights.resolved(job.engine.dtype),
            affinity=job.engine.affinity,
            priority=job.engine.priority,
            placement_pools=job.placement_pools() if auto else [],
            placement_rates=prior_rates(job) if auto else {},
            placement_engines=prior_engines(job) if auto else {},
            limits=job.temporal.limits,
        )


def prior_engines(job: JobSpec) -> dict[str, int]:
    """Each placement pool's engines, at least: `training.placement.engines`, else its kubernetes replicas."""
    out = {}
    for pool in job.placement_pools():
        deployment = job.kubernetes.pools.get(pool) if job.kubernetes else None
        given = job.training.placement.engines.get(pool) or (deployment.replicas if deployment else None)
        if given:
            out[pool] = given
    return out


def prior_rates(job: JobSpec) -> dict[str, tuple[float, float]]:
    """Each placement pool's rates before its engines report: `training.placement.rates`, else the roofline of the
    pool's GPU for a `training.placement.model_params` model; pools with neither are left out."""
    cfg = job.training.placement
    out = {pool: cfg.rates[pool] for pool in job.placement_pools() if pool in cfg.rates}
    for pool in job.placement_pools():
        gpu = job.pools[pool].gpu
        if pool in out or gpu is None or cfg.model_params is None or gpu.product not in GPUS:
            continue
        r = engine_rates(gpu.product, cfg.model_params, gpus=gpu.count or job.engine.tensor_parallel_size)
        out[pool] = (r.prefill_tokens_per_s, r.decode_tokens_per_s)
    return out


class TrainingInput(BaseModel):
    """A job to train: its `plan` (what `rollart train` sends), or the whole job spec as `job` (what a
    `temporal workflow start` user may send; the plan is taken from it). `state` is set only by continue-as-new.
    A large one (the state a paper-sized job carries) goes to the store, its history events a claim."""

    model_config = ConfigDict(extra="forbid")
    claim_over_bytes: ClassVar[int] = BULK_CLAIM_BYTES

    job: JobSpec | None = None
    plan: TrainingPlan | None = None
    job_id: str = Field(min_length=1)
    run_dir: str
    state: TrainingState | None = None

    @model_validator(mode="after")
    def _one_plan(self) -> TrainingInput:
        if (self.job is None) == (self.plan is None):
            raise ValueError("give the job spec as `job` or its training plan as `plan`, not both or neither")
        if self.plan is None:
            self.plan, self.job = TrainingPlan.of(self.job), None  # type: ignore[arg-type]
        return self


class TrainingStatus(BaseModel):
    """The `status` query's answer: where the loop is and the ledger's terms."""

    job_id: str
    step: int
    steps: int
    version: int
    async_bound: int
    rollout_mode: str
    started: int
    trained: int
    dropped: int
    failed: int
    in_flight: int
    buffered: int
    paused: bool
    stopping: bool
    done: bool
    ledger_balanced: bool
    started_at: float = 0.0
    restores: int = 0
    duplicates_ignored: int = 0
    filtered: int = 0
    history: list[StepRecord] = Field(default_factory=list)
    stalls: list[Stall] = Field(default_factory=list)  # pools without workers, or no progress: see training.stall
    stop_when: StopWhen | None = None  # the job's stop rule (training.stop_when)
    stop_held: int = 0  # consecutive steps, the last included, that met it
    ended_by: EndedBy | None = None  # once the job ends or has decided to: why
    in_flight_limit: int = 0  # the async bound's cap on in flight + buffered
    admission_cap: int | None = None  # the adaptive cap on in flight by engine pressure (None: not adaptive)
    admission_cuts: int = 0  # times engine pressure cut it
    engine_moves: int = 0  # turns served by another engine than the trajectory's turn before
    engines: dict[str, EnginePressure] = Field(default_factory=dict)  # each engine's last report, by worker
    placement: PlacementState | None = None  # where generate_pool: auto tasks go, and why


class TrainingResult(BaseModel):
    """What a finished job returns."""

    job_id: str
    steps: int
    version: int
    started: int
    trained: int
    dropped: int
    failed: int
    cancelled_in_flight: int
    buffered_unused: int
    last: StepRecord | None = None
    filtered: int = 0
    ended_by: EndedBy = "steps"
    max_steps: int | None = None  # training.steps, the cap (None: results from before the field)
    stop_when: StopWhen | None = None  # the job's stop rule (training.stop_when)

    def describe_end(self) -> str:
        """Why the job ended, in a line: "learned: success ≥ 0.95 held for 20 steps, ended at step 96 of 200"."""
        of = f" of {self.max_steps}" if self.max_steps is not None else ""
        if self.ended_by == "stop_when" and self.stop_when is not None:
            return f"learned: {self.stop_when.describe()}, ended at step {self.steps}{of}"
        if self.ended_by == "stop_signal":
            return f"stopped by its stop signal at step {self.steps}{of}"
        rule = f"; stop_when ({self.stop_when.describe()}) did not end it earlier" if self.stop_when else ""
        return f"trained all {self.steps} steps{rule}"

    def end_note(self) -> str | None:
        """`describe_end()` when there is more to it than "trained all its steps" (a stop rule, the stop signal)."""
        return self.describe_end() if self.ended_by != "steps" or self.stop_when is not None else None
