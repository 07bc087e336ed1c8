"""Pick the inference engine a job asks for, without importing vLLM until it is needed.

Why lazy: workflow code, the CLI and HF-only tests import this module; vLLM
takes seconds to import and must stay out of Temporal's workflow sandbox.
"""

from __future__ import annotations

from pathlib import Path

from rollart.activities.engines.base import Engine
from rollart.spec.config import EngineConfig

__all__ = ["create_engine"]


def create_engine(model_dir: Path, cfg: EngineConfig) -> Engine:
    """An unstarted engine of kind `cfg.kind` ("vllm" or "hf") for `model_dir`; call `await engine.start()`."""
    if cfg.kind == "vllm":
        from rollart.activities.engines.vllm_engine import VllmEngine

        return VllmEngine.from_config(Path(model_dir), cfg)
    if cfg.kind == "hf":
        from rollart.activities.engines.hf_engine import HfEngine

        return HfEngine.from_config(Path(model_dir), cfg)
    raise ValueError(f"unknown engine kind {cfg.kind!r}; use 'vllm' (default) or 'hf' (plain transformers, for tests)")
