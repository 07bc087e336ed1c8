"""Code that runs *inside* vLLM's model worker: the in-place weight reload behind `VllmEngine.load_weights`.

vLLM mixes `WeightReloadExtension` into its worker class when the engine is
built with `worker_extension_cls=WORKER_EXTENSION`; the engine then reaches
it with `collective_rpc(RELOAD_METHOD, args=(path,))`. Why a path and not the
tensors: `collective_rpc` serialises its arguments and tensors arrive as
lists, so the worker reads the safetensors blob itself.

The worker re-imports this module in its own process, so it must stay
importable without side effects (no engine, no model at import).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

__all__ = ["RELOAD_METHOD", "WORKER_EXTENSION", "WeightReloadExtension", "iter_safetensors"]

log = logging.getLogger(__name__)

WORKER_EXTENSION = "rollart.activities.engines.vllm_extension.WeightReloadExtension"
"""Qualified name vLLM resolves for `AsyncEngineArgs(worker_extension_cls=...)`."""

RELOAD_METHOD = "rollart_reload_weights"
"""Name of the extension method called through `collective_rpc` (prefixed so it cannot clash with vLLM's own)."""


def iter_safetensors(path: str) -> Iterator[tuple[str, Any]]:
    """Yield `(name, tensor)` pairs of a safetensors file one at a time (no second full copy in memory)."""
    from safetensors import safe_open

    with safe_open(path, framework="pt", device="cpu") as f:
        for name in f.keys():  # noqa: SIM118 - safe_open handles are not iterable
            yield name, f.get_tensor(name)


class WeightReloadExtension:
    """Mixed into vLLM's worker: reload weights in place from a safetensors file of the full state dict.

    `self.model_runner` and `self.vllm_config` are the worker's own
    attributes; this class only adds a method.
    """

    model_runner: Any
    vllm_config: Any

    def rollart_reload_weights(self, path: str) -> int:
        """Load the blob at `path` into the running model; return how many tensors it held.

        After `reload_weights` the embedding layers are re-packed: on CPU
        vLLM keeps a pre-packed copy of every `VocabParallelEmbedding`'s
        weight for its GEMM, and the tied `lm_head` (a `ParallelLMHead`,
        which shares the embedding's weight but is not itself in the blob)
        would otherwise keep computing logits with the *old* weights
        (logprob error ~1.8 on the tiny model).
        """
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

        count = 0

        def counted() -> Iterator[tuple[str, Any]]:
            nonlocal count
            for item in iter_safetensors(path):
                count += 1
                yield item

        with set_current_vllm_config(self.vllm_config):
            self.model_runner.reload_weights(weights_iterator=counted())
            model = self.model_runner.get_model()
            repacked = 0
            for module in model.modules():
                if isinstance(module, VocabParallelEmbedding):
                    module.quant_method.process_weights_after_loading(module)
                    repacked += 1
        log.info("reloaded %d tensors from %s, re-packed %d embedding layers", count, path, repacked)
        return count
