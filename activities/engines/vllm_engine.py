"""The default engine: one vLLM v1 `AsyncLLM` per worker process, serving every concurrent request.

Why one `AsyncLLM` per worker: all `generate()` calls awaited concurrently on
the worker's event loop are batched continuously by it, which is what makes
many short agentic turns cheap. `AsyncLLM` always runs its EngineCore in a
spawned child process (~1.9 GiB RSS with 1 GiB KV cache, ~15-20 s to start
here); `VLLM_ENABLE_V1_MULTIPROCESSING=0` keeps the model worker inside that
child instead of a third process. The child re-imports the main module:
callers need an `if __name__ == "__main__"` guard.

vLLM is imported inside `start()`, never at module import, so workflow code
and light tools can import this package without pulling in vLLM.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
import uuid
from pathlib import Path
from typing import Any

from rollart.activities.engines.base import (
    Completion,
    Engine,
    EngineDeadError,
    EngineError,
    EngineOutput,
    EngineRequestError,
)
from rollart.infra.config import EngineConfig, SamplingParams

__all__ = ["VllmEngine"]

log = logging.getLogger(__name__)


class VllmEngine(Engine):
    """vLLM `AsyncLLM` behind the `Engine` contract (float32, eager, one EngineCore child).

    Construct with `from_config`, then `await start()` on the loop that will
    call `generate`. Logprobs are vLLM's default `raw_logprobs`: log-softmax
    of the model's logits before temperature/top-p, i.e. exactly what a
    teacher-forced forward pass of the same weights gives.
    """

    def __init__(
        self,
        model_dir: Path,
        *,
        max_model_len: int = 512,
        max_num_seqs: int = 128,
        kv_cache_gib: float = 1.0,
        dtype: str = "float32",
        seed: int = 0,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.kv_cache_gib = kv_cache_gib
        self.dtype = dtype
        self.seed = seed
        self.policy_version = 0
        self._llm: Any = None
        self._tokens = 0
        self._dead = False

    @classmethod
    def from_config(cls, model_dir: Path, cfg: EngineConfig) -> VllmEngine:
        """An unstarted engine for `model_dir` with the job's engine settings."""
        return cls(
            model_dir,
            max_model_len=cfg.max_model_len,
            max_num_seqs=cfg.max_num_seqs,
            kv_cache_gib=cfg.kv_cache_gib,
            dtype=cfg.dtype,
            seed=cfg.seed,
        )

    def _set_env(self) -> None:
        """vLLM reads these when the engine is built; set them before it is."""
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        # Without it the CPU backend reserves most of the RAM for KV cache.
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, math.ceil(self.kv_cache_gib)))
        os.environ["HF_HUB_OFFLINE"] = "1"

    async def start(self) -> None:
        """Create the `AsyncLLM` on the running loop and warm it up.

        The warm-up request asks for logprobs because the first such request
        compiles a kernel (10-35 s here); better now than in the first rollout.
        """
        if self._llm is not None:
            return
        if not (self.model_dir / "config.json").is_file():
            raise FileNotFoundError(
                f"no model at {self.model_dir} (config.json missing); build one with `rollart init-model --out {self.model_dir}`"
            )
        self._set_env()
        self._dead = False
        t0 = time.perf_counter()
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(
            model=str(self.model_dir),
            dtype=self.dtype,
            enforce_eager=True,  # compiled mode costs ~30 s at start and was slower here
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs,
            seed=self.seed,
            disable_log_stats=True,
        )
        try:
            self._llm = AsyncLLM.from_engine_args(args)
        except Exception as e:
            raise EngineDeadError(f"vLLM failed to start on {self.model_dir}: {e}") from e
        t1 = time.perf_counter()
        warm = SamplingParams(temperature=1.0, max_tokens=4, n=2)
        await self.generate("SFFF\nFHFH\nmove:", warm, "warmup")
        self._tokens = 0
        log.info(
            "vLLM engine ready: start %.1f s + warm-up %.1f s (%s)",
            t1 - t0,
            time.perf_counter() - t1,
            self.model_dir,
        )

    def _vllm_params(self, sampling: SamplingParams) -> Any:
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind

        return VSamplingParams(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,  # 0 = full vocabulary in both APIs
            max_tokens=sampling.max_tokens,
            stop=list(sampling.stop) or None,
            logprobs=0,  # only the sampled token's logprob
            output_kind=RequestOutputKind.FINAL_ONLY,  # with n>1 the last streamed delta can lack a completion
        )

    async def generate(self, prompt: str, sampling: SamplingParams, request_id: str) -> EngineOutput:
        """Sample `sampling.n` completions; batched with every other in-flight call.

        `request_id` gets a uuid suffix so retries of the same activity never
        collide in vLLM. Cancelling the caller aborts the vLLM request.
        """
        if self._llm is None:
            raise EngineDeadError("engine not started: call `await engine.start()` first")
        if self._dead or self._llm.errored:
            self._dead = True
            raise EngineDeadError("the vLLM engine has died; restart the generation worker")
        from vllm.exceptions import VLLMClientError
        from vllm.v1.engine.exceptions import EngineDeadError as VllmDeadError

        rid = f"{request_id}-{uuid.uuid4().hex[:12]}"
        version = self.policy_version
        final = None
        try:
            async for out in self._llm.generate(prompt, self._vllm_params(sampling), rid):
                final = out
        except asyncio.CancelledError:
            raise
        except VllmDeadError as e:
            self._dead = True
            raise EngineDeadError(f"the vLLM engine died during request {rid}: {e}") from e
        except (VLLMClientError, ValueError) as e:
            raise EngineRequestError(f"request {rid} rejected: {e}") from e
        except Exception as e:
            if self._llm.errored:
                self._dead = True
                raise EngineDeadError(f"the vLLM engine died during request {rid}: {e}") from e
            raise EngineError(f"request {rid} failed: {type(e).__name__}: {e}") from e
        if final is None or len(final.outputs) != sampling.n:
            got = 0 if final is None else len(final.outputs)
            raise EngineError(f"request {rid} returned {got} completions, expected {sampling.n}")
        completions = []
        for c in sorted(final.outputs, key=lambda c: c.index):
            ids = list(c.token_ids)
            lps = c.logprobs or []
            logprobs = [float(lps[i][tok].logprob) for i, tok in enumerate(ids)]
            completions.append(Completion(ids, logprobs, c.text, str(c.finish_reason)))
            self._tokens += len(ids)
        return EngineOutput(
            prompt_ids=list(final.prompt_token_ids or []),
            completions=completions,
            policy_version=version,
            policy_version_end=self.policy_version,
        )

    # TODO(weight-swap issue): add `async def update_weights(path, version)`:
    # `pause_generation(mode="keep")` -> `collective_rpc(<worker_extension method>, args=(path,))`
    # that calls `model_runner.reload_weights(...)` and re-packs every
    # VocabParallelEmbedding (`m.quant_method.process_weights_after_loading(m)`,
    # else the tied lm_head keeps old weights) -> check `reset_prefix_cache()` ->
    # `resume_generation()` -> `self.policy_version = version`. Needs
    # `worker_extension_cls=` in AsyncEngineArgs. See DEPENDENCIES.md.

    async def shutdown(self) -> None:
        """Stop the engine (in-flight requests fail) and drop it; safe to call twice."""
        llm, self._llm = self._llm, None
        if llm is not None:
            llm.shutdown()
        self._dead = True

    def tokens_generated(self) -> int:
        """Tokens generated since warm-up, over all completions."""
        return self._tokens
