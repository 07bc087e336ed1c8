"""The job's `engine` section: the inference engine every generation worker runs, and how turns find their engine."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rollart.spec.config.base import Section

__all__ = ["AffinityConfig", "EngineConfig"]


class AffinityConfig(Section):
    """Which engine of a generation pool serves a trajectory's turns (`engine.affinity`; `session` / `none` is short
    for `{mode: ...}`).

    A pool may have many generation workers, one engine each. With `session` a trajectory's turns after the
    first go to the private queue of the engine that served its previous turn, where its prompt's prefix is
    cached; a turn waits at most `start_wait_s` there before it goes to the pool's shared queue (the engine's
    worker is gone or swamped), and so does a turn the engine refuses because more than `max_waiting` requests
    wait in its scheduler. Whichever engine then serves the turn is the trajectory's from then on. A turn running
    on an engine that stops heartbeating for `heartbeat_s` (its worker died) is retried the same way. Single-turn
    waves are split across the pool's live engines. `none`: every turn goes to the shared queue, any engine.
    """

    mode: Literal["session", "none"] = "session"
    start_wait_s: float = Field(
        2.0, gt=0.0, description="how long a pinned turn may wait on its engine's private queue before going elsewhere"
    )
    heartbeat_s: float = Field(
        60.0,
        ge=3.0,
        description="a turn whose engine sends no heartbeat for this long is taken as lost (its worker died) and "
        "retried on another engine; the engine beats every third of it, and each beat is a billed Temporal action",
    )
    max_waiting: int | None = Field(
        32,
        ge=0,
        description="an engine refuses pinned turns (they go to the shared queue) while more requests than this wait "
        "in its scheduler; None: never",
    )

    @model_validator(mode="before")
    @classmethod
    def _mode_alone(cls, value: Any) -> Any:
        return {"mode": value} if isinstance(value, str) else value

    @property
    def sticky(self) -> bool:
        """Whether turns go to the engine that served the trajectory before."""
        return self.mode == "session"


PriorityPolicy = Literal["fifo", "turns", "predicted"]
"""How a generation request ranks among those waiting on an engine (workflows/driver/priority.py)."""


class EngineConfig(Section):
    """The inference engine of a generation worker.

    `kv_cache_gib` sizes the KV cache on CPUs (vLLM's CPU backend); on GPUs `gpu_memory_utilization`
    does (the share of each GPU's memory vLLM may take, weights included). `tensor_parallel_size`
    GPUs serve one engine (a generation worker then needs that many GPUs: `rollart k8s render`
    requests them). `dtype` is the engine's compute dtype; weights published in float32 are cast on
    load. `max_lora_rank` makes the engine serve LoRA adapters up to that rank (vLLM's `enable_lora`); a job
    with `trainer.lora` fills it with the adapters' rank, so it is rarely set by hand.
    """

    kind: Literal["vllm", "hf"] = "vllm"
    max_model_len: int = Field(512, ge=16)
    max_num_seqs: int = Field(128, ge=1)
    kv_cache_gib: float = Field(1.0, gt=0)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    tensor_parallel_size: int = Field(1, ge=1, le=64)
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    enable_prefix_caching: bool = True
    max_lora_rank: int | None = Field(None, ge=1, le=512)
    seed: int = 0
    affinity: AffinityConfig = Field(default_factory=AffinityConfig)
    priority: PriorityPolicy = Field(
        "fifo",
        description="which waiting generation request the engine serves first: `fifo`, in arrival order; `turns`, "
        "the trajectory with the most turns done (vLLM's priority scheduling: the long tail is not held back by "
        "episodes just starting); `predicted`, the trajectory predicted longest (its group's first finished member's "
        "turns, else its task's recent mean), long tails first. The HF engine serves in arrival order",
    )
