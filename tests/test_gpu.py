"""On a machine with a GPU: the CUDA builds do rollart's work (the checks of `python -m bench gpu`).

vLLM on CUDA serving and swapping weights, the megatron trainer on NCCL ranks against the torch
backend, and 3 training steps through the whole stack. Skipped where torch sees no GPU: the same
code paths run on the CPU in test_megatron_backend.py, test_megatron_trainer.py and the
integration tests.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason=f"no GPU visible to torch {torch.__version__} (the CPU paths are tested elsewhere)",
    ),
]


async def test_the_gpu_checks_pass() -> None:
    from bench.gpu import run

    assert await run("cuda")
