"""The job's `training` and `metrics` sections: the loop (steps, batches, staleness, stalls, dynamic sampling,
when to stop) and where each step's metrics go."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rollart.spec.config.base import Section

__all__ = [
    "AdmissionConfig",
    "DynamicSamplingConfig",
    "MetricsConfig",
    "PlacementConfig",
    "StallConfig",
    "StopWhen",
    "TrainingConfig",
    "WandbConfig",
]


class StallConfig(Section):
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


class DynamicSamplingConfig(Section):
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


class WandbConfig(Section):
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


class MetricsConfig(Section):
    """Where the training client exports each step's metrics besides `metrics.jsonl` (`metrics`).

    `tensorboard`: event files in the run dir's `tensorboard/` (`tensorboard --logdir runs/`); `wandb`: a W&B run.
    """

    tensorboard: bool = True
    wandb: WandbConfig = WandbConfig()


class StopWhen(Section):
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


class AdmissionConfig(Section):
    """How many trajectories the job keeps in flight below the async bound's cap, by engine pressure
    (`training.admission`; `true` / `false` is short for `{adaptive: ...}`).

    The async bound caps trajectories in flight plus buffered at `(async_bound + 1) × batch_size`; that cap
    always holds. With `adaptive`, trajectories in flight are also held under a cap of their own that starts
    at the bound's and moves once per round (a cap's worth of finished trajectories) with what the engines
    report with every generation (AIMD, as TCP's window): it is multiplied by `backoff` after a round in
    which the engines preempted more than `max_preempted` requests per finished trajectory, or one reported
    its KV cache at least `kv_high` full with requests waiting (or more than `max_waiting` waiting), and
    grows by `increase` trajectories after a round without. It never goes below one launch (a group, or a
    batch in batch mode) nor above the bound's cap. `rollart status` and the run report show it.
    """

    adaptive: bool = True
    kv_high: float = Field(
        0.9, gt=0.0, le=1.0, description="KV cache use (a share) at which an engine with requests waiting is full"
    )
    max_preempted: float = Field(
        0.25, ge=0.0, description="preemptions per trajectory finished in a round above which the engines are pressed"
    )
    max_waiting: int | None = Field(
        None, ge=0, description="requests waiting in an engine's scheduler above which it is pressed; None: not used"
    )
    backoff: float = Field(0.7, gt=0.0, lt=1.0, description="the cap's factor after a round under pressure")
    increase: int | None = Field(
        None,
        ge=1,
        description="trajectories the cap grows by after a round without pressure (None: a group or a sixteenth of "
        "the bound's cap, whichever is more)",
    )

    @model_validator(mode="before")
    @classmethod
    def _on_or_off(cls, value: Any) -> Any:
        return {"adaptive": value} if isinstance(value, bool) else value


class PlacementConfig(Section):
    """How tasks with `generate_pool: auto` are placed on generation pools (`training.placement`).

    They start spread over `pools` in turn, so every pool serves some and reports its rates. Every
    `every_steps` steps the training workflow re-plans (workflows/training/placement.py): each task's
    trajectories and tokens per step since the last plan (every one that finished, trained or not), each pool's
    engines and their prefill and decode rates as they measure them, and spec/placement.py's assignment with the
    shortest step. A pool none of whose engines has reported yet is planned with `rates` (tokens/s per engine), else the
    roofline of its GPU for a `model_params` model (spec/hardware.py), else the mean of the measured pools.
    """

    every_steps: int = Field(5, ge=1, description="re-plan after every this many steps")
    pools: list[str] | None = Field(
        None, min_length=1, description="the generation pools auto tasks may use (default: every generation pool)"
    )
    rates: dict[str, tuple[float, float]] = Field(
        default_factory=dict,
        description="a pool's (prefill, decode) tokens/s per engine, until its engines report their own",
    )
    model_params: float | None = Field(
        None, gt=0, description="the model's parameter count, for GPU rooflines of pools not yet measured"
    )
    engines: dict[str, int] = Field(
        default_factory=dict,
        description="a pool's engines, at least (default: its kubernetes replicas, else 1); more that report count",
    )


class TrainingConfig(Section):
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
    continue_as_new_every: int | None = Field(
        None,
        ge=1,
        description="a cap: the training workflow continues as new after this many steps in one run at the latest "
        "(it does so anyway as its history nears Temporal's limits: `temporal.limits`); null: no cap",
    )
    groups_per_workflow: int = Field(
        8,
        ge=1,
        description="multi-turn groups (`rollout_unit: group`, trajectory mode) one GroupRolloutWorkflow plays at "
        "most: its history "
        "grows with its groups' turns, and Temporal caps a run's events, bytes and pending activities "
        "(a single-turn wave takes every group drawn at once: its history does not grow with them)",
    )
    fail_after_failures: int | None = Field(
        32,
        ge=1,
        description="end the job (failed, with the reason) once a whole admission window of trajectories in a row "
        "(`(async_bound + 1) × batch_size`, and at least this many) failed for the same reason no retry cures "
        "(bad input, an env that raises, a trajectory workflow that failed) with none completed between; "
        "null: launch on whatever fails",
    )
    seed: int = 0
    stall: StallConfig = StallConfig()
    dynamic_sampling: DynamicSamplingConfig = DynamicSamplingConfig()
    admission: AdmissionConfig = AdmissionConfig()
    placement: PlacementConfig = PlacementConfig()
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
