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

With `engine.max_lora_rank` (a `trainer.lora` job) the engine is built with vLLM's LoRA support and
serves each published version as an adapter on the base weights it loaded once (`load_adapter`,
`vllm_adapters.py`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
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
    WeightsBlobError,
    check_source,
)
from rollart.activities.engines.vllm_adapters import MAX_LORAS, VllmAdapters, vllm_lora_rank
from rollart.contracts.generation import EnginePressure
from rollart.infra.store.weights import WeightsSource
from rollart.spec.config import EngineConfig, SamplingParams

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
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.9,
        enable_prefix_caching: bool = True,
        max_lora_rank: int | None = None,
        priority: str = "fifo",
    ) -> None:
        self.model_dir = Path(model_dir)
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.kv_cache_gib = kv_cache_gib
        self.dtype = dtype
        self.seed = seed
        self.tensor_parallel_size = tensor_parallel_size
        self.gpu_memory_utilization = gpu_memory_utilization
        self.enable_prefix_caching = enable_prefix_caching
        self.max_lora_rank = max_lora_rank
        self.priority = priority  # "fifo": vLLM's fcfs scheduler; otherwise its priority scheduler
        self.policy_version = 0
        self._llm: Any = None
        self._stats: Any = None  # vllm_stats.EngineStats, fed by vLLM's stat loggers once started
        self._tokens = 0
        self._dead = False
        self._swap_lock = asyncio.Lock()
        self._adapters = None if max_lora_rank is None else VllmAdapters(lambda: self._llm, max_lora_rank)
        self._full_loads = 0  # full-weight swaps begun: an adapter request spanning one mixes two policies

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
            tensor_parallel_size=cfg.tensor_parallel_size,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            enable_prefix_caching=cfg.enable_prefix_caching,
            max_lora_rank=cfg.max_lora_rank,
            priority=cfg.priority,
        )

    def _set_env(self) -> None:
        """vLLM reads these when the engine is built; set them before it is."""
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        # Without it the CPU backend reserves most of the RAM for KV cache.
        if self.kv_cache_gib >= 1 and float(self.kv_cache_gib).is_integer():
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(int(self.kv_cache_gib))
        else:  # whole GiB only there: a fraction (a small cache, to see pressure) goes as bytes (`engine_args`)
            os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
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
                f"no model at {self.model_dir} (config.json missing); build one with `rollart init-model --out "
                f"{self.model_dir}`"
            )
        self._set_env()
        self._dead = False
        t0 = time.perf_counter()
        from vllm.v1.engine.async_llm import AsyncLLM

        from rollart.activities.engines.vllm_stats import EngineStats

        self._stats = EngineStats(self.max_num_seqs)
        try:
            self._llm = AsyncLLM.from_engine_args(self.engine_args(), stat_loggers=[self._stats.factory])
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

    def engine_args(self) -> Any:
        """vLLM's `AsyncEngineArgs` for this engine: the job's settings, eager mode on CPUs, CUDA graphs on GPUs."""
        import torch
        from vllm.engine.arg_utils import AsyncEngineArgs

        from rollart.activities.engines.vllm_extension import WORKER_EXTENSION

        return AsyncEngineArgs(
            model=str(self.model_dir),
            dtype=self.dtype,
            enforce_eager=not torch.cuda.is_available(),  # compiling costs ~30 s at start on CPUs and was slower here
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs,
            seed=self.seed,
            tensor_parallel_size=self.tensor_parallel_size,  # GPUs per engine (CUDA builds)
            gpu_memory_utilization=self.gpu_memory_utilization,  # GPU memory share (CUDA builds; CPUs use kv_cache_gib)
            kv_cache_memory_bytes=self._kv_cache_bytes(),
            enable_prefix_caching=self.enable_prefix_caching,
            disable_log_stats=True,
            worker_extension_cls=WORKER_EXTENSION,  # adds the in-place weight load (load_weights)
            scheduling_policy="fcfs" if self.priority == "fifo" else "priority",
            **self._lora_args(),
        )

    def _lora_args(self) -> dict[str, Any]:
        """vLLM's LoRA settings when the engine serves adapters (none otherwise: LoRA layers cost every request)."""
        if self.max_lora_rank is None:
            return {}
        return {"enable_lora": True, "max_loras": MAX_LORAS, "max_lora_rank": vllm_lora_rank(self.max_lora_rank)}

    def _kv_cache_bytes(self) -> int | None:
        """The CPU KV cache in bytes when `kv_cache_gib` is not a whole number of GiB (the environment variable
        takes whole GiB only); None otherwise, and on GPUs, where `gpu_memory_utilization` sizes it."""
        import torch

        whole = self.kv_cache_gib >= 1 and float(self.kv_cache_gib).is_integer()
        return None if whole or torch.cuda.is_available() else int(self.kv_cache_gib * 2**30)

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

    async def generate(
        self, prompt: str | list[int], sampling: SamplingParams, request_id: str, priority: int = 0
    ) -> EngineOutput:
        """Sample `sampling.n` completions; batched with every other in-flight call. A prompt of token ids goes
        to vLLM as they are (no tokenization). With the priority scheduler, waiting requests of lower `priority`
        run first (ties in arrival order); with `fifo` it is ignored.

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
        version, loads = self.policy_version, self._full_loads
        adapter = None if self._adapters is None else self._adapters.begin()
        lora = None if adapter is None else adapter.request
        final = None
        try:
            rank = {} if self.priority == "fifo" else {"priority": priority}
            async for out in self._llm.generate(
                _prompt(prompt), self._vllm_params(sampling), rid, lora_request=lora, **rank
            ):
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
        finally:
            if self._adapters is not None:
                self._adapters.end(adapter)
        if final is None or len(final.outputs) != sampling.n:
            got = 0 if final is None else len(final.outputs)
            raise EngineError(f"request {rid} returned {got} completions, expected {sampling.n}")
        completions = []
        for c in sorted(final.outputs, key=lambda c: c.index):
            ids = list(c.token_ids)
            lps = c.logprobs or []
            logprobs = [float(lps[i][tok].logprob) for i, tok in enumerate(ids)]
            # a final output without a reason did not finish on its own: an aborted request
            completions.append(Completion(ids, logprobs, c.text, c.finish_reason or "abort"))
            self._tokens += len(ids)
        return EngineOutput(
            prompt_ids=list(final.prompt_token_ids or []),
            completions=completions,
            policy_version=version,
            # an adapter never changes under its requests: only a full-weight swap makes one span two versions
            policy_version_end=version if adapter is not None and loads == self._full_loads else self.policy_version,
        )

    async def load_weights(self, source: WeightsSource | None, version: int, *, force: bool = False) -> None:
        """Stream the version `source` names (None: the model dir's own weights) into the running vLLM, then become
        `version`.

        Sequence (vLLM 0.32 `AsyncLLM`), one swap at a time (a lock):

        1. Pause the scheduler, keeping in-flight requests (`mode="keep"`):
           they are frozen, not aborted, so no rollout is lost; new requests
           queue. (`pause_scheduler_async` directly: `pause_generation` adds a
           fixed 20 ms sleep that is only for the ordering of outputs.)
        2. `collective_rpc(LOAD_METHOD, args=(source,))`: the worker
           extension streams the buckets from the store into the model in
           place and re-packs the tied embedding / lm_head (`vllm_extension`).
        3. `reset_prefix_cache(reset_running_requests=True)`: cached KV
           blocks were computed by the old weights and must not be reused.
           A plain `reset_prefix_cache()` refuses while frozen requests hold
           blocks ("some blocks are not freed yet"); with
           `reset_running_requests=True` vLLM preempts them, so it succeeds
           and the frozen requests recompute their KV with the *new* weights
           on resume (their already sampled tokens and logprobs are kept).
           Its result is still checked: if it ever refuses, we retry after
           resuming, then log an error (stale cache is an accuracy problem,
           not a crash).
        4. `policy_version = version`, then resume. Setting the version
           before resuming keeps stamps conservative: any token sampled with
           the new weights is read after the version changed.

        Requests in flight during the swap mix tokens of both versions and
        are stamped `(old, new)`. A failed load (a bucket that does not arrive
        within `weights.timeout_s`, say) leaves vLLM with partly written
        weights, so the engine is marked dead (`EngineDeadError`, naming the
        version and its publisher).
        """
        if self._llm is None:
            raise EngineDeadError("engine not started: call `await engine.start()` before load_weights")
        if self._dead or self._llm.errored:
            self._dead = True
            raise EngineDeadError("the vLLM engine has died; restart the generation worker")
        async with self._swap_lock:
            if version <= self.policy_version and not force:
                log.info("weights v%d not newer than v%d: nothing to load", version, self.policy_version)
                return
            if source is not None:
                await asyncio.to_thread(check_source, source, self.model_dir, self.delta_base)
            t0 = time.perf_counter()
            self._before_full_load()
            # Shielded: a caller cancelled mid-swap must not leave vLLM paused or half-loaded; the swap
            # finishes (and keeps the lock) before the cancellation propagates.
            task = asyncio.ensure_future(self._swap(source, version))
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                await asyncio.wait([task])
                raise
            what = source.manifest.describe() if source else f"the weights of {self.model_dir}"
            log.info("vLLM engine now at policy v%d (swap %.3f s: %s)", version, time.perf_counter() - t0, what)

    async def _swap(self, source: WeightsSource | None, version: int) -> None:
        """Pause, stream the weights in, clear the prefix cache, resume; any failure marks the engine dead."""
        from rollart.activities.engines.vllm_extension import LOAD_METHOD

        llm = self._llm
        what = source.manifest.describe() if source else f"the weights of {self.model_dir}"
        self.delta_base = None
        try:
            await llm.engine_core.pause_scheduler_async(mode="keep", clear_cache=False)
            stats = await llm.collective_rpc(LOAD_METHOD, args=(source.model_dump_json() if source else None,))
            cleared = await llm.reset_prefix_cache(reset_running_requests=True)
            self.policy_version = version
            await llm.resume_generation()
        except Exception as e:
            self._dead = True
            raise EngineDeadError(
                f"loading {what} failed, leaving vLLM paused or with partly loaded weights: "
                f"{type(e).__name__}: {e}; restart the generation worker"
            ) from e
        if source is not None and (source.manifest.kind == "delta" or source.manifest.deltas):
            self.delta_base = (source.manifest.job_id, source.manifest.version)
        log.debug("load v%d: %s, prefix cache reset: %s", version, stats, cleared)
        if not cleared:
            await self._retry_reset_prefix_cache(version)

    async def _retry_reset_prefix_cache(self, version: int, attempts: int = 20, delay_s: float = 0.05) -> None:
        """Retry a refused prefix-cache reset after resuming (blocks free up as requests finish)."""
        for _ in range(attempts):
            await asyncio.sleep(delay_s)
            if await self._llm.reset_prefix_cache():
                return
        log.error(
            "could not reset vLLM's prefix cache after loading v%d: prompts sharing a cached prefix may reuse "
            "KV computed by the old weights until those blocks are evicted",
            version,
        )

    def _before_full_load(self) -> None:
        """Before a swap of the full weights: an adapter request spanning it is stamped with both versions, and
        no adapter is served from now on (vLLM's reload drops them all; one trained on other base weights would
        not fit the new ones)."""
        self._full_loads += 1
        if self._adapters is not None:
            self._adapters.serve(None)

    @property
    def serves_adapters(self) -> bool:
        return self._adapters is not None

    async def load_adapter(self, path: Path | None, version: int, *, force: bool = False, owned: bool = False) -> None:
        """Serve the adapter in `path` as policy `version`: vLLM's `add_lora`, then new requests carry it.

        No pause, no reload: the base weights stay, requests in flight finish on the adapter they started with,
        and the replaced adapter leaves vLLM (its directory the disk, when `owned`) after the last of them.
        """
        if self._adapters is None:
            raise WeightsBlobError(
                f"this vLLM engine was built without LoRA (engine.max_lora_rank unset), so it cannot serve the adapter "
                f"v{version} in {path}; start the generation workers with the job's spec (trainer.lora sets it)"
            )
        if self._llm is None:
            raise EngineDeadError("engine not started: call `await engine.start()` before load_adapter")
        if self._dead or self._llm.errored:
            self._dead = True
            raise EngineDeadError("the vLLM engine has died; restart the generation worker")
        async with self._swap_lock:
            if version <= self.policy_version and not force:
                log.info("adapter v%d not newer than v%d: nothing to load", version, self.policy_version)
                if owned and path is not None:
                    shutil.rmtree(path, ignore_errors=True)
                return
            t0 = time.perf_counter()
            try:
                adapter = None if path is None else await self._adapters.add(Path(path).absolute(), version, owned)
            except BaseException:
                if owned and path is not None:
                    shutil.rmtree(path, ignore_errors=True)
                raise
            self._adapters.serve(adapter)
            self.policy_version = version
            log.info("vLLM engine now at policy v%d (adapter %s, %.3f s)", version, path, time.perf_counter() - t0)

    async def shutdown(self) -> None:
        """Stop the engine (in-flight requests fail) and drop it; safe to call twice."""
        llm, self._llm = self._llm, None
        if llm is not None:
            llm.shutdown()
        self._dead = True
        if self._adapters is not None:
            self._adapters.close()

    def tokens_generated(self) -> int:
        """Tokens generated since warm-up, over all completions."""
        return self._tokens

    def pressure(self) -> EnginePressure:
        """The scheduler's last numbers and the counts since start (warm-up included), from vLLM's stat loggers."""
        return self._stats.snapshot() if self._stats is not None else EnginePressure()


def _prompt(prompt: str | list[int]) -> object:
    """A prompt as vLLM takes it: text, or token ids that it must not tokenize again."""
    if isinstance(prompt, str):
        return prompt
    from vllm.inputs import TokensPrompt

    return TokensPrompt(prompt_token_ids=list(prompt))
