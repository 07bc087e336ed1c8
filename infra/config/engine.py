"""The job's `engine` section: the inference engine every generation worker runs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rollart.infra.config.base import Section

__all__ = ["EngineConfig"]


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
