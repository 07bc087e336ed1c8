"""What a generation engine can do on a GPU, from the GPU's public specs: prefill and decode rooflines.

A prefill is compute bound: each prompt token costs ~2 × params FLOPs, so an engine prefills
`FLOPs × mfu / (2 × params)` tokens/s. A decode step reads every weight once for the whole running batch, and
each request's KV cache (its context), so at batch B it emits B tokens per
`max((weight bytes + B × context × KV bytes per token) / (HBM bandwidth × mbu), 2 × params × B / (FLOPs × mfu))` s.
Attention FLOPs and scheduling gaps are left out: a planning prior, to be replaced by measured rates
(`spec/placement.py` takes either). Per GPU the H20 decodes about as fast as the H800 and prefills ~7x slower:
it is the decode pool because it costs a fraction of the H800, not because it is faster.

Specs (dense BF16 tensor FLOPs, HBM bandwidth), from NVIDIA's datasheets: H800 SXM 989 TFLOPS, 3.35 TB/s (the H100
SXM's compute, cut interconnect); H20 148 TFLOPS, 4.0 TB/s (a fraction of the compute, more bandwidth: the
decode-heavy pool of the RollArt paper); H200 989 TFLOPS, 4.8 TB/s; H100 SXM 989 TFLOPS, 3.35 TB/s.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GPUS", "EngineRates", "GpuModel", "engine_rates"]


@dataclass(frozen=True)
class GpuModel:
    """One GPU's roofline: dense BF16 FLOP/s and HBM bytes/s."""

    flops: float
    hbm_bytes_per_s: float


GPUS: dict[str, GpuModel] = {
    "NVIDIA-H800": GpuModel(flops=989e12, hbm_bytes_per_s=3.35e12),
    "NVIDIA-H20": GpuModel(flops=148e12, hbm_bytes_per_s=4.0e12),
    "NVIDIA-H200": GpuModel(flops=989e12, hbm_bytes_per_s=4.8e12),
    "NVIDIA-H100-80GB-HBM3": GpuModel(flops=989e12, hbm_bytes_per_s=3.35e12),
}
"""By the `gpu.product` a pool declares (the `nvidia.com/gpu.product` node label)."""


@dataclass(frozen=True)
class EngineRates:
    """What one engine sustains: prompt tokens prefilled per second, and tokens decoded per second at its batch."""

    prefill_tokens_per_s: float
    decode_tokens_per_s: float


def engine_rates(
    product: str,
    params: float,
    gpus: int = 1,
    batch: int = 64,
    context: int = 2048,
    kv_bytes_per_token: float = 57_344,
    bytes_per_param: float = 2.0,
    mfu: float = 0.5,
    mbu: float = 0.7,
) -> EngineRates:
    """The roofline rates of an engine of `gpus` × `product` (tensor parallel) serving a `params` model, decoding
    `batch` requests of `context` tokens at once (KV bytes per token: 57,344 is a 7B model with grouped-query
    attention, 28 layers × 4 KV heads × 128 × K and V × 2 bytes); `mfu` / `mbu` are the shares of peak FLOPs and
    bandwidth it reaches."""
    if product not in GPUS:
        raise ValueError(f"no roofline for GPU {product!r}; known: {', '.join(sorted(GPUS))}")
    if params <= 0 or gpus < 1 or batch < 1:
        raise ValueError(f"params, gpus and batch must be positive (got {params}, {gpus}, {batch})")
    gpu = GPUS[product]
    flops, bandwidth = gpu.flops * gpus * mfu, gpu.hbm_bytes_per_s * gpus * mbu
    read_bytes = params * bytes_per_param + batch * context * kv_bytes_per_token
    step_s = max(read_bytes / bandwidth, 2 * params * batch / flops)
    return EngineRates(prefill_tokens_per_s=flops / (2 * params), decode_tokens_per_s=batch / step_s)
