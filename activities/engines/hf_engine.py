"""A plain transformers engine: the fallback that makes unit tests fast and vLLM-free.

Why it exists: vLLM takes ~20 s to start; tests of activities and workflows
only need *an* engine with the same contract. It serves one request at a time
(an asyncio lock) and runs the model in a thread so the event loop stays
responsive. Sampling matches vLLM's: full vocabulary (HF's default top_k=50 is
turned off), temperature and top-p; logprobs are vLLM's default
`raw_logprobs` (log-softmax of the unscaled logits). LoRA adapters (a `trainer.lora`
job's versions) are served through peft, on the base weights loaded at start.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from rollart.activities.engines.base import (
    TIED_HEAD,
    Completion,
    Engine,
    EngineDeadError,
    EngineError,
    EngineOutput,
    EngineRequestError,
    RateMeter,
    check_adapter_dir,
    check_source,
)
from rollart.contracts.generation import EnginePressure
from rollart.infra.store.weights import WeightsSource
from rollart.spec.config import EngineConfig, SamplingParams

__all__ = ["HfEngine"]

log = logging.getLogger(__name__)


class HfEngine(Engine):
    """transformers `AutoModelForCausalLM` on CPU behind the `Engine` contract (one request at a time)."""

    def __init__(self, model_dir: Path, *, max_model_len: int = 512, dtype: str = "float32", seed: int = 0) -> None:
        self.model_dir = Path(model_dir)
        self.max_model_len = max_model_len
        self.dtype = dtype
        self.seed = seed
        self.policy_version = 0
        self._model: Any = None
        self._tok: Any = None
        self._lock = asyncio.Lock()
        self._tokens = 0
        self._mirror: Any = None  # a DeltaMirror once weights are loaded (torch-side, imported then)
        self._peft: Any = None  # the model wrapped by peft while an adapter is served (its layers carry it)
        self._adapter_ids = itertools.count(1)
        self._rates = RateMeter()

    @classmethod
    def from_config(cls, model_dir: Path, cfg: EngineConfig) -> HfEngine:
        """An unstarted engine for `model_dir` (only `max_model_len`, `dtype`, `seed` apply)."""
        return cls(model_dir, max_model_len=cfg.max_model_len, dtype=cfg.dtype, seed=cfg.seed)

    async def start(self) -> None:
        """Load tokenizer and model in a thread, then run one warm-up request."""
        if self._model is not None:
            return
        if not (self.model_dir / "config.json").is_file():
            raise FileNotFoundError(
                f"no model at {self.model_dir} (config.json missing); build one with `rollart init-model --out "
                f"{self.model_dir}`"
            )
        t0 = time.perf_counter()
        self._tok, self._model = await asyncio.to_thread(self._load)
        await self.generate("SFFF\nmove:", SamplingParams(max_tokens=2, n=2), "warmup")
        self._tokens = 0
        self._rates = RateMeter()  # the warm-up's first forward passes are not the engine's speed
        log.info("HF engine ready in %.1f s (%s)", time.perf_counter() - t0, self.model_dir)

    def _load(self) -> tuple[Any, Any]:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.manual_seed(self.seed)
        tok = AutoTokenizer.from_pretrained(self.model_dir)
        dtype = torch.float32 if self.dtype == "float32" else torch.bfloat16
        model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=dtype).eval()
        return tok, model

    async def generate(
        self, prompt: str | list[int], sampling: SamplingParams, request_id: str, priority: int = 0
    ) -> EngineOutput:
        """Sample `sampling.n` completions; requests queue behind each other, in arrival order (`priority` is
        ignored).

        Cancelling stops the generation at the next token (the thread checks a flag).
        """
        if self._model is None:
            raise EngineDeadError("engine not started (or shut down): call `await engine.start()` first")
        async with self._lock:
            version = self.policy_version
            cancel = threading.Event()
            task = asyncio.ensure_future(asyncio.to_thread(self._generate_sync, prompt, sampling, cancel))
            try:
                prompt_ids, completions, (prefill_s, decode_s) = await asyncio.shield(task)
            except asyncio.CancelledError:
                cancel.set()
                await asyncio.wait([task])  # keep the lock until the thread is done
                raise
            except ValueError as e:
                raise EngineRequestError(f"request {request_id} rejected: {e}") from e
            except RuntimeError as e:
                raise EngineError(f"request {request_id} failed: {type(e).__name__}: {e}") from e
        generated = sum(len(c.token_ids) for c in completions)
        self._tokens += generated
        self._rates.prefill_tokens += len(prompt_ids)
        self._rates.prefill_s += prefill_s
        self._rates.decode_tokens += max(0, generated - len(completions))  # each first token came with the prefill
        self._rates.decode_s += decode_s
        self._rates.decode_steps += max((len(c.token_ids) for c in completions), default=1) - 1  # n tokens a step
        return EngineOutput(prompt_ids, completions, version, self.policy_version)

    def _generate_sync(
        self, prompt: str | list[int], sampling: SamplingParams, cancel: threading.Event
    ) -> tuple[list[int], list[Completion], tuple[float, float]]:
        """The prompt's ids, the completions, and the seconds of the prefill (the first forward pass, to the
        first token) and of the decode after it."""
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        first_token_at: list[float] = []

        class _Cancelled(StoppingCriteria):  # called after each token: the first call ends the prefill
            def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
                if not first_token_at:
                    first_token_at.append(time.perf_counter())
                return torch.full((input_ids.shape[0],), cancel.is_set(), dtype=torch.bool)

        tok, model = self._tok, self._model
        text_ids = tok(prompt, add_special_tokens=False)["input_ids"] if isinstance(prompt, str) else None
        prompt_ids: list[int] = list(prompt) if text_ids is None else text_ids  # token ids are taken as they are
        if len(prompt_ids) + sampling.max_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({sampling.max_tokens}) exceeds "
                f"max_model_len {self.max_model_len}; shorten the prompt or raise engine.max_model_len"
            )
        eos = tok.eos_token_id
        greedy = sampling.temperature == 0
        kwargs: dict[str, Any] = {
            "do_sample": not greedy,
            "max_new_tokens": sampling.max_tokens,
            "num_return_sequences": sampling.n,
            "output_logits": True,  # raw logits, before temperature/top-p: vLLM's raw_logprobs
            "return_dict_in_generate": True,
            "eos_token_id": eos,
            "pad_token_id": eos,
            "stopping_criteria": StoppingCriteriaList([_Cancelled()]),
        }
        if not greedy:
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or 0)
        if sampling.stop:
            kwargs.update(stop_strings=list(sampling.stop), tokenizer=tok)
        started = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids)), **kwargs)
        ended = time.perf_counter()
        if cancel.is_set():
            raise asyncio.CancelledError()
        first = first_token_at[0] if first_token_at else ended
        timings = (first - started, ended - first)
        new = out.sequences[:, len(prompt_ids) :]
        logprobs = torch.log_softmax(torch.stack(out.logits, dim=1).float(), dim=-1)  # [n, steps, vocab]
        completions = []
        for i in range(sampling.n):
            ids = new[i].tolist()
            finish = "length"
            if eos in ids:  # keep the eos token, as vLLM does; drop the padding after it
                ids = ids[: ids.index(eos) + 1]
                finish = "stop"
            text = tok.decode(ids, skip_special_tokens=True)
            if sampling.stop and any(s in text for s in sampling.stop):
                # vLLM stops at the token completing a stop string and leaves the string out of the text
                k = next(k for k in range(1, len(ids) + 1) if any(s in tok.decode(ids[:k]) for s in sampling.stop))
                ids, finish = ids[:k], "stop"
                text = tok.decode(ids, skip_special_tokens=True)
                text = text[: min(text.index(s) for s in sampling.stop if s in text)]
            lps = logprobs[i, torch.arange(len(ids)), torch.tensor(ids, dtype=torch.long)].tolist() if ids else []
            completions.append(Completion(ids, lps, text, finish))
        return prompt_ids, completions, timings

    async def load_weights(self, source: WeightsSource | None, version: int, *, force: bool = False) -> None:
        """Stream the version `source` names (None: the model dir's own weights) into the model and become
        `version`.

        Runs under the request lock, so a swap waits for the current
        request and no request ever mixes versions here (the HF engine never
        stamps `policy_version != policy_version_end` from a swap). A
        `version` not newer than the current one is a no-op.
        """
        if self._model is None:
            raise EngineDeadError("engine not started (or shut down): call `await engine.start()` first")
        async with self._lock:
            if version <= self.policy_version and not force:
                log.info("weights v%d not newer than v%d: nothing to load", version, self.policy_version)
                return
            t0 = time.perf_counter()
            task = asyncio.ensure_future(asyncio.to_thread(self._load_weights_sync, source))
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                await asyncio.wait([task])  # keep the lock until the thread has finished writing weights
                if task.exception() is None:
                    self.policy_version = version
                raise
            self.policy_version = version
            log.info(
                "HF engine now at policy v%d (swap %.3f s: %s)",
                version,
                time.perf_counter() - t0,
                source.manifest.describe() if source else f"the weights of {self.model_dir}",
            )

    def _load_weights_sync(self, source: WeightsSource | None) -> None:
        """Validate the manifest, then copy the streamed tensors in; re-tie so lm_head follows the embedding."""
        import torch

        from rollart.activities.rl.checkpoint_layout import copy_placed, placements
        from rollart.activities.rl.weights_io import hf_model_tensors
        from rollart.infra.store.payload import open_store_to_read
        from rollart.infra.store.weight_delta import DeltaMirror, engine_stream

        if self._mirror is None:
            self._mirror = DeltaMirror()
        if source is not None:
            check_source(source, self.model_dir, self.delta_base)
        self.delta_base = None
        self._drop_adapter()  # full weights: the adapter's layers go (their names are not the base's)
        params = dict(self._model.named_parameters())
        where = placements(self._model, {name: p.shape for name, p in params.items()})  # checkpoint names
        if source is None:
            self._mirror.drop()
            with hf_model_tensors(self.model_dir) as get, torch.no_grad():
                for name, placed in where.items():
                    copy_placed(params[placed.name], placed, get(name), name)
            return
        manifest = source.manifest
        try:
            with torch.no_grad():
                for name, t in engine_stream(open_store_to_read(source.store), manifest, self._mirror):
                    if name == TIED_HEAD and name not in where:
                        continue
                    copy_placed(params[where[name].name], where[name], t, name)
        except Exception as e:
            self._model = None  # partly overwritten: never serve from it
            self._mirror.drop()
            raise EngineDeadError(
                f"loading {manifest.describe()} into the HF model failed half-way ({type(e).__name__}: {e}); "
                "restart the engine"
            ) from e
        self._mirror.mark(manifest.job_id, manifest.version)
        if manifest.kind == "delta" or manifest.deltas:
            self.delta_base = (manifest.job_id, manifest.version)
        if bool(getattr(self._model.config, "tie_word_embeddings", False)):
            self._model.tie_weights()

    @property
    def serves_adapters(self) -> bool:
        return True

    async def load_adapter(self, path: Path | None, version: int, *, force: bool = False, owned: bool = False) -> None:
        """Serve the adapter in `path` (read into memory at once, so an `owned` copy is deleted at once).

        Under the request lock, like `load_weights`: no request spans it.
        """
        if self._model is None:
            raise EngineDeadError("engine not started (or shut down): call `await engine.start()` first")
        try:
            async with self._lock:
                if version <= self.policy_version and not force:
                    log.info("adapter v%d not newer than v%d: nothing to load", version, self.policy_version)
                    return
                task = asyncio.ensure_future(asyncio.to_thread(self._load_adapter_sync, path, version))
                try:
                    await asyncio.shield(task)
                except asyncio.CancelledError:
                    await asyncio.wait([task])
                    if task.exception() is None:
                        self.policy_version = version
                    raise
                self.policy_version = version
                log.info("HF engine now at policy v%d (adapter %s)", version, path)
        finally:
            if owned and path is not None:
                shutil.rmtree(path, ignore_errors=True)

    def _load_adapter_sync(self, path: Path | None, version: int) -> None:
        from peft import PeftModel

        if path is None:
            self._drop_adapter()
            return
        check_adapter_dir(Path(path))
        name = f"v{version}-{next(self._adapter_ids)}"
        try:
            if self._peft is None:
                self._peft = PeftModel.from_pretrained(self._model, str(path), adapter_name=name).eval()
            else:
                old = self._peft.active_adapter
                self._peft.load_adapter(str(path), adapter_name=name)
                self._peft.set_adapter(name)
                self._peft.delete_adapter(old)
        except Exception as e:
            self._model = None  # peft may have changed its layers half-way: never serve from it
            raise EngineDeadError(f"loading the adapter in {path} failed ({type(e).__name__}: {e}); restart") from e

    def _drop_adapter(self) -> None:
        """Serve the base weights alone again: peft's layers removed, nothing merged."""
        if self._peft is not None:
            self._model = self._peft.unload()
            self._peft = None

    async def shutdown(self) -> None:
        """Drop the model (after the current request); safe to call twice."""
        async with self._lock:
            self._model = self._tok = self._peft = None

    def tokens_generated(self) -> int:
        """Tokens generated since warm-up, over all completions."""
        return self._tokens

    def pressure(self) -> EnginePressure:
        """Only its rates: one request at a time, no KV cache to fill, no prefix cache."""
        return self._rates.report()
