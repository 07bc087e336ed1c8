"""Code that runs *inside* vLLM's model worker: the in-place weight load behind `VllmEngine.load_weights`.

vLLM mixes `WeightReloadExtension` into its worker class when the engine is
built with `worker_extension_cls=WORKER_EXTENSION`; the engine then reaches
it with `collective_rpc(LOAD_METHOD, args=(source_json,))`. Why a description
of the source and not the tensors: `collective_rpc` serialises its arguments
(tensors arrive as lists), so the worker opens the store itself and streams
the buckets straight into the model, with no file of the whole model between.

The worker re-imports this module in its own process, so it must stay
importable without side effects (no engine, no model, no store at import).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["LOAD_METHOD", "WORKER_EXTENSION", "WeightReloadExtension"]

log = logging.getLogger(__name__)

WORKER_EXTENSION = "rollart.activities.engines.vllm_extension.WeightReloadExtension"
"""Qualified name vLLM resolves for `AsyncEngineArgs(worker_extension_cls=...)`."""

LOAD_METHOD = "rollart_load_weights"
"""Name of the extension method called through `collective_rpc` (prefixed so it cannot clash with vLLM's own)."""


class WeightReloadExtension:
    """Mixed into vLLM's worker: load a published version in place, streamed bucket by bucket from the store.

    `self.model_runner` and `self.vllm_config` are the worker's own attributes; this class adds a method and,
    for jobs that publish deltas, a copy of the weights it holds (`DeltaMirror`).
    """

    model_runner: Any
    vllm_config: Any

    def rollart_load_weights(self, source_json: str | None) -> dict[str, float]:
        """Load the version `source_json` (a `WeightsSource`) describes, or with None the model dir's own weights
        from disk; return the tensor count and the time it took.

        After `reload_weights` the embedding layers are re-packed: on CPU
        vLLM keeps a pre-packed copy of every `VocabParallelEmbedding`'s
        weight for its GEMM, and the tied `lm_head` (a `ParallelLMHead`,
        which shares the embedding's weight but is not itself published)
        would otherwise keep computing logits with the *old* weights
        (logprob error ~1.8 on the tiny model). So are a MoE's experts on CPU (`_repack_cpu_experts`).
        """
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

        from rollart.infra.store.payload import open_store_to_read
        from rollart.infra.store.weight_delta import DeltaMirror, engine_stream
        from rollart.infra.store.weights import WeightsSource

        t0 = time.perf_counter()
        source = WeightsSource.model_validate_json(source_json) if source_json is not None else None
        mirror: DeltaMirror = self.__dict__.setdefault("_rollart_mirror", DeltaMirror())
        count = 0

        def counted(stream: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
            nonlocal count
            for item in stream:
                count += 1
                yield item

        try:
            stream = (
                None
                if source is None
                else counted(engine_stream(open_store_to_read(source.store), source.manifest, mirror))
            )
            if source is None:
                mirror.drop()
            with set_current_vllm_config(self.vllm_config):
                self.model_runner.reload_weights(weights_iterator=stream)  # None: from the model dir
                for module in self.model_runner.get_model().modules():
                    if isinstance(module, VocabParallelEmbedding):
                        module.quant_method.process_weights_after_loading(module)
                    _repack_cpu_experts(module)
        except BaseException:
            mirror.drop()
            raise
        if source is not None:
            mirror.mark(source.manifest.job_id, source.manifest.version)
        took = time.perf_counter() - t0
        log.info(
            "loaded %d tensors of %s in %.3f s", count, source.manifest.describe() if source else "the model dir", took
        )
        return {"tensors": float(count), "load_s": took}


def _repack_cpu_experts(module: Any) -> None:
    """Pack a MoE layer's reloaded experts into the CPU kernel's layout, as its first load did.

    vLLM 0.32 skips that step on a weight update (`UnquantizedFusedMoEMethod._setup_kernel` runs
    `fused_experts.process_weights_after_loading` only when it first builds the kernel): the reloaded weights
    land, unpacked, in the packed tensors, and a Qwen3-MoE's log-probs come out ~0.6 nats off. GPU kernels
    need no packing; a layer with no CPU experts is left alone.
    """
    try:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError:  # a vLLM without CPU experts
        return
    kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
    experts = getattr(kernel, "fused_experts", None)
    if isinstance(experts, CPUUnquantizedExperts):
        experts.process_weights_after_loading(module)
