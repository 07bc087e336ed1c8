"""Rooflines of the generation GPUs: how long a vLLM iteration takes on an engine, from public specs.

An iteration of a continuous-batching engine reads every weight once and every running sequence's KV cache
once, and does 2 · params FLOPs per token it processes (the prompt tokens it prefills plus one per running
sequence it decodes). Its time is whichever bound is slower — compute or HBM bandwidth — at an achievable
fraction of the peak, plus a fixed per-iteration cost (scheduling, sampling, kernel launches):

    t = max(2 · P · tokens / (tp · FLOPS · mfu), (W + kv_bytes · context) / (tp · HBM · mbu)) + overhead

Peak numbers (dense BF16, no sparsity):
- H800 SXM5: 989 TFLOPS, 80 GB HBM3 at 3.35 TB/s — the H100 SXM5's compute and memory (NVIDIA H100 Tensor Core
  GPU datasheet, 2023: "BF16 Tensor Core 1,979 TFLOPS with sparsity", i.e. 989 dense; 3.35 TB/s); the H800
  differs only in NVLink (400 GB/s instead of 900), which a tensor-parallel engine within a node barely feels.
- H20: 148 TFLOPS BF16, 96 GB HBM3 at 4.0 TB/s (NVIDIA HGX H20 product brief, 2023/24, as reported by
  SemiAnalysis and vendors' spec sheets): a sixth of the H800's compute, more bandwidth: built for decode.
The paper's premise follows: prefill is compute-bound (H800's), decode bandwidth-bound (H20 does it as well).
Pure arithmetic, no state.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollart.spec.hardware import GPUS as HW  # the peaks rollart plans with (`rollart plan`): one table

__all__ = ["GPUS", "H20", "H800", "MODELS", "EngineRoofline", "GpuSpec", "ModelSpec"]


@dataclass(frozen=True)
class GpuSpec:
    """One GPU's peak dense BF16 compute (FLOP/s), HBM bandwidth (B/s) and HBM size (bytes)."""

    name: str
    flops: float
    hbm_bw: float
    hbm_bytes: float


H800 = GpuSpec("H800", flops=HW["NVIDIA-H800"].flops, hbm_bw=HW["NVIDIA-H800"].hbm_bytes_per_s, hbm_bytes=80e9)
H20 = GpuSpec("H20", flops=HW["NVIDIA-H20"].flops, hbm_bw=HW["NVIDIA-H20"].hbm_bytes_per_s, hbm_bytes=96e9)
GPUS: dict[str, GpuSpec] = {"h800": H800, "h20": H20}


@dataclass(frozen=True)
class ModelSpec:
    """A dense decoder in bf16: its parameters and the KV cache bytes one token keeps (2 · layers · kv heads ·
    head dim · 2 bytes)."""

    name: str
    params: float
    kv_bytes_per_token: float
    bytes_per_param: float = 2.0

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_param


MODELS: dict[str, ModelSpec] = {
    # Qwen2.5-7B: 28 layers, 4 KV heads of 128 → 2·28·4·128·2 B = 56 KiB a token
    "7b": ModelSpec("7B", params=7.6e9, kv_bytes_per_token=2 * 28 * 4 * 128 * 2),
    # Qwen2.5-32B: 64 layers, 8 KV heads of 128 → 256 KiB a token
    "32b": ModelSpec("32B", params=32.8e9, kv_bytes_per_token=2 * 64 * 8 * 128 * 2),
}


@dataclass(frozen=True)
class EngineRoofline:
    """One engine: `tp` GPUs of `gpu` serving `model`; `mfu`/`mbu` the achievable shares of peak compute and
    bandwidth; `overhead_s` the fixed cost of an iteration; `mem_util` the HBM share vLLM may use."""

    gpu: GpuSpec
    model: ModelSpec
    tp: int = 1
    mfu: float = 0.5
    mbu: float = 0.8
    overhead_s: float = 0.003
    mem_util: float = 0.9

    @property
    def flops(self) -> float:
        return self.tp * self.gpu.flops * self.mfu

    @property
    def bandwidth(self) -> float:
        return self.tp * self.gpu.hbm_bw * self.mbu

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens of KV cache that fit beside the weights."""
        free = self.tp * self.gpu.hbm_bytes * self.mem_util - self.model.weight_bytes
        if free <= 0:
            raise ValueError(
                f"{self.model.name} ({self.model.weight_bytes / 1e9:.0f} GB) does not fit on {self.tp} x "
                f"{self.gpu.name}: raise tp"
            )
        return int(free / self.model.kv_bytes_per_token)

    def compute_s(self, tokens: float) -> float:
        """Seconds of compute for `tokens` tokens through the model (2 · params FLOPs each)."""
        return 2.0 * self.model.params * tokens / self.flops

    def memory_s(self, context_tokens: float) -> float:
        """Seconds to read the weights once and `context_tokens` tokens of KV cache."""
        return (self.model.weight_bytes + self.model.kv_bytes_per_token * context_tokens) / self.bandwidth

    def prefill_s(self, prompt_tokens: float) -> float:
        """A prompt alone: max(compute, one read of the weights)."""
        return max(self.compute_s(prompt_tokens), self.memory_s(prompt_tokens)) + self.overhead_s

    def iteration_s(self, decode_seqs: int, context_tokens: float, prefill_tokens: float = 0.0) -> float:
        """One iteration: `decode_seqs` sequences decode a token each over `context_tokens` of KV cache, and
        `prefill_tokens` new prompt tokens are prefilled in the same pass (chunked prefill)."""
        compute = self.compute_s(decode_seqs + prefill_tokens)
        return max(compute, self.memory_s(context_tokens)) + self.overhead_s
