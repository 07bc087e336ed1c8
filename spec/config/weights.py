"""The job's `weights` section: how a new policy version travels from the trainer to the engines."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rollart.spec.config.base import Section

__all__ = ["WeightsConfig", "WeightsDtype"]

WeightsDtype = Literal["float32", "bfloat16", "float16"]


class WeightsConfig(Section):
    """Published weights: their dtype, the size of the pieces they travel in, how long a transfer may take.

    A version is streamed tensor by tensor into *buckets* of at most `bucket_mib` MiB, each one store object,
    by the trainer ranks that hold the shards (no whole-model copy on rank 0), and streamed the same way into
    each running engine (no temporary file). `dtype: auto` publishes in the engine's dtype (`engine.dtype`):
    bf16 halves the bytes of fp32 and is what a GPU engine computes in anyway; the trainer's fp32 master
    weights never leave it. `timeout_s` bounds every piece of a transfer: a bucket not written or not received
    in that time fails the publish or the load with the version and the peer named, never a hang.

    `delta: true` also publishes each version as a delta against the one before, for engines that hold
    exactly that one: tensors whose values did not change are left out, changed ones go as the positions and
    new values of their changed elements when that is smaller than the tensor. Both sides then keep one copy
    of the model in `dtype` (the trainer's last publish, each engine's last load) to take and apply deltas.
    """

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    bucket_mib: int = Field(256, ge=1, le=64 * 1024)
    timeout_s: float = Field(120.0, gt=0.0)
    delta: bool = False

    def resolved(self, engine_dtype: str) -> WeightsConfig:
        """This section with `dtype: auto` replaced by the engine's dtype (what the trainer publishes)."""
        if self.dtype != "auto":
            return self
        return self.model_copy(update={"dtype": engine_dtype})

    @property
    def bucket_bytes(self) -> int:
        """The bucket size in bytes."""
        return self.bucket_mib * 1024 * 1024
