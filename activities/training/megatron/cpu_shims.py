"""The changes megatron-core 0.16.1 needs to run on a CPU-only torch (gloo); never applied on GPUs.

Verified in shared/probes/megatron_cpu_tp.py (log-probs equal to HF within 5e-7 at TP=2):

1. `torch.cuda.current_device()` is called by code that runs even with `use_cpu_initialization`:
   RoPE moves its frequencies "to the GPU" on every forward, tensor-parallel all-gathers allocate
   their output there, and DDP's gradient buffers live there. A CPU build raises "Torch not
   compiled with CUDA enabled"; returning the CPU device keeps all of that on the CPU.
2. The model-parallel RNG tracker forks CUDA RNG states (attention dropout runs inside it, and
   activation recomputation saves and restores it). A tracker that forks the CPU generator has the
   same semantics: a separately seeded stream per tensor-parallel rank.
3. Activation recomputation (`trainer.activation_checkpointing`) saves and restores "the CUDA RNG
   state" around each recomputed layer; on a CPU build there is none (the CPU generator and the
   tracker above are saved and restored beside it), so getting it returns an empty state and
   setting it does nothing.

And one that MoE models need wherever Transformer Engine is missing (CPUs, and GPUs without it), so
`apply_moe_router_shim` is applied on every device: megatron-core 0.16.1's router GEMM tests
`te_general_gemm is not None`, but `moe_utils` only defines that name when TE imports, so the
first MoE forward raises NameError. Defining it as None selects the plain torch matmul (verified
in the MoE probe: router gradients equal HF's within 1.3e-7).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["apply_cpu_shims", "apply_moe_router_shim"]

_applied = False


def apply_cpu_shims() -> None:
    """Make megatron-core usable on a CPU-only torch in this process (idempotent)."""
    global _applied
    if _applied:
        return
    from megatron.core.tensor_parallel import random as mrandom

    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment]

    class CpuRNGStatesTracker(mrandom.CudaRNGStatesTracker):
        """Megatron's RNG tracker over the CPU generator."""

        def add(self, name: str, seed: int) -> None:
            self._is_initialized = True
            if seed in self.seeds_:
                raise ValueError(f"seed {seed} already exists")
            if name in self.states_:
                raise ValueError(f"rng state {name} already exists")
            self.seeds_.add(seed)
            self.states_[name] = torch.Generator().manual_seed(seed).get_state()

        @contextlib.contextmanager
        def fork(self, name: str = mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME) -> Iterator[None]:
            if name not in self.states_:
                raise ValueError(f"rng state {name} is not added")
            orig = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(orig)

    mrandom._CUDA_RNG_STATE_TRACKER = CpuRNGStatesTracker()
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    mrandom._get_cuda_rng_state = lambda *args, **kwargs: torch.empty(0, dtype=torch.uint8)
    mrandom._set_cuda_rng_state = lambda *args, **kwargs: None
    _applied = True


def apply_moe_router_shim() -> None:
    """Let megatron's MoE router run without Transformer Engine (a no-op where TE defined `te_general_gemm`)."""
    from megatron.core.transformer.moe import moe_utils

    if "te_general_gemm" not in vars(moe_utils):
        moe_utils.te_general_gemm = None  # type: ignore[attr-defined]
