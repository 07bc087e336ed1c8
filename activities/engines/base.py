"""The engine contract: what a generation worker needs from an inference engine.

One method (`generate`) plus a lifecycle (`start`, `shutdown`). Engines return
token ids and the *behaviour* logprob of every sampled token, because the
trainer needs both (importance ratios against the policy that actually
sampled), and they stamp every output with the policy version at the start
and end of the request so weight swaps in the middle of a generation are
visible downstream.

Weights are swapped in place with `load_weights(source, version)`: the
trainer publishes each version as a manifest and buckets of tensors in the
store (`infra/store/weights.py`, without `lm_head.weight` when the embeddings
are tied), and the engine streams them in. `check_weights` validates a
manifest against the model directory from its tensor list alone, before an
engine touches its live weights. A LoRA job
(`trainer.lora`) publishes only its adapter: `load_adapter(path, version)`
serves it on the unchanged base weights (`check_adapter_dir` first).

This module is light (no torch, no vLLM) so it can be imported anywhere.
"""

from __future__ import annotations

import json
import struct
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from rollart.contracts.generation import EnginePressure, FinishReason
from rollart.infra.store.weights import WeightsManifest, WeightsSource
from rollart.spec.config import SamplingParams

__all__ = [
    "TIED_HEAD",
    "Completion",
    "Engine",
    "EngineDeadError",
    "EngineError",
    "EngineOutput",
    "EngineRequestError",
    "RateMeter",
    "WeightsBlobError",
    "check_adapter_dir",
    "check_source",
    "check_weights",
    "safetensors_header",
]

TIED_HEAD = "lm_head.weight"
"""The one tensor a blob may omit: with tied embeddings it is the embedding matrix itself."""


@dataclass
class RateMeter:
    """An engine's own measure of its speed: prompt tokens computed and the seconds spent prefilling, tokens
    decoded and the seconds spent decoding, since it started (reported in `EnginePressure`)."""

    prefill_tokens: int = 0
    prefill_s: float = 0.0
    decode_tokens: int = 0
    decode_s: float = 0.0
    decode_steps: int = 0
    max_batch: int = 0  # sequences it decodes at once at most (0: one request at a time)

    def report(self, pressure: EnginePressure | None = None) -> EnginePressure:
        """`pressure` (default: an empty report) with these counts."""
        counts = {
            "prefill_tokens": self.prefill_tokens,
            "prefill_s": round(self.prefill_s, 6),
            "decode_tokens": self.decode_tokens,
            "decode_s": round(self.decode_s, 6),
            "decode_steps": self.decode_steps,
            "max_batch": self.max_batch,
        }
        return (pressure or EnginePressure()).model_copy(update=counts)


@dataclass(frozen=True)
class Completion:
    """One sampled continuation of a prompt.

    `logprobs[i]` is the log-probability of `token_ids[i]` under the engine's
    policy (log-softmax of the raw logits, before temperature / top-p: vLLM's
    default `logprobs_mode="raw_logprobs"`), which is what the trainer
    compares its own recomputed logprobs against.
    """

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: FinishReason


@dataclass(frozen=True)
class EngineOutput:
    """All completions of one request, with the policy versions that produced them.

    `policy_version != policy_version_end` means the weights were swapped
    while this request was in flight (its tokens mix two policies).
    """

    prompt_ids: list[int]
    completions: list[Completion]  # len == sampling.n
    policy_version: int
    policy_version_end: int


class EngineError(RuntimeError):
    """A request failed, but the engine is still usable: retrying the request makes sense."""


class EngineRequestError(EngineError):
    """The request itself is invalid (prompt longer than `max_model_len`, bad sampling params): no retry can help."""


class EngineDeadError(RuntimeError):
    """The engine cannot serve any more requests: restart the worker (or call `start()` on a new engine)."""


class WeightsBlobError(ValueError):
    """Published weights do not fit the engine's model (missing/extra tensors, wrong shapes, unreadable).

    Raised before any live weight is touched: the engine keeps serving the old version.
    """


class Engine(ABC):
    """An inference engine serving many concurrent `generate` calls from one asyncio loop.

    Why an interface: the generation activity must not care whether vLLM (the
    default, continuous batching) or plain transformers (a fallback for fast
    tests) does the work. Constructors do nothing heavy; `start()` loads the
    model and warms it up, on the event loop that will call `generate`.
    """

    policy_version: int = 0

    @abstractmethod
    async def start(self) -> None:
        """Load the model and warm up (including one logprobs request), so the first real call is fast."""

    @abstractmethod
    async def generate(
        self, prompt: str | list[int], sampling: SamplingParams, request_id: str, priority: int = 0
    ) -> EngineOutput:
        """Sample `sampling.n` completions of `prompt` (text, or token ids taken as they are). An engine that
        schedules by priority serves waiting requests of lower `priority` first; others ignore it.

        Raises `EngineError` if this request failed, `EngineDeadError` if the
        engine is gone. Cancelling the awaiting task aborts the request.
        """

    delta_base: tuple[str, int] | None = None
    """(job, version) this engine can apply a delta publish to (it keeps a copy of those weights), else None."""

    async def load_weights(self, source: WeightsSource | None, version: int, *, force: bool = False) -> None:
        """Stream in the weights `source` names (a full version, or a delta from `delta_base`) and become `version`;
        `source=None` is the model directory's own weights (version 0 of any job).

        Generation keeps going around the swap; requests in flight during it
        are stamped `policy_version < policy_version_end`. A `version` not
        newer than `policy_version` is a no-op, so replayed or racing
        updates are harmless — unless `force` (another job's weights, whose
        versions count from 0 again). Raises `WeightsBlobError` (engine unchanged)
        for weights that do not fit the model, `EngineDeadError` if the
        swap broke the engine (a transfer that failed half-way, naming the version and its publisher).

        Not abstract so that scripted test engines need not implement it.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot swap weights; use the vllm or hf engine")

    @property
    def serves_adapters(self) -> bool:
        """Whether `load_adapter` works (the vLLM engine: when built with `engine.max_lora_rank`)."""
        return False

    async def load_adapter(self, path: Path | None, version: int, *, force: bool = False, owned: bool = False) -> None:
        """Serve the LoRA adapter in the directory `path` (peft's layout) on the base weights as policy `version`;
        None: the base alone.

        New requests use it; requests in flight keep the adapter they started with (they are stamped with its
        version at both ends). The base weights are not touched. A `version` not newer than `policy_version` is
        a no-op unless `force` (another job's adapter). `owned`: `path` is a private copy the engine deletes once
        no request needs it (or at once, if it is not loaded). Raises `WeightsBlobError` (engine unchanged) for an
        adapter it cannot serve.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot serve LoRA adapters")

    @abstractmethod
    async def shutdown(self) -> None:
        """Release the model and any background processes; safe to call twice."""

    @abstractmethod
    def tokens_generated(self) -> int:
        """Running count of generated tokens (all completions), for tokens/s metrics."""

    def pressure(self) -> EnginePressure:
        """How loaded the engine is now, with its prefix-cache, preemption and rate counts since it started: what
        session affinity, admission and placement read (returned with every generation). An engine that keeps
        no such numbers reports zeros."""
        return EnginePressure()


def safetensors_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """`name -> (dtype, shape)` of every tensor in a safetensors file, read from its header only.

    Why not `safetensors.safe_open`: this module stays free of torch, and
    the header (8-byte little-endian length + JSON) is all a check needs.
    """
    path = Path(path)
    try:
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if size > 100 * 2**20:
                raise ValueError(f"header of {size} bytes is implausibly large")
            header = json.loads(f.read(size))
    except (OSError, struct.error, ValueError) as e:
        raise WeightsBlobError(f"cannot read a safetensors header from {path}: {e}") from e
    return {
        name: (str(meta["dtype"]), tuple(int(d) for d in meta["shape"]))
        for name, meta in header.items()
        if name != "__metadata__"
    }


def check_adapter_dir(path: Path, max_rank: int | None = None) -> dict:
    """The adapter config in `path`, or `WeightsBlobError` unless it is a LoRA adapter an engine can serve.

    What vLLM refuses (DoRA, trained biases, `modules_to_save`, a rank over the engine's) is refused here, by
    name, before the engine is asked to load it.
    """
    from rollart.infra.store.adapters import ADAPTER_CONFIG, ADAPTER_WEIGHTS

    path = Path(path)
    try:
        config = json.loads((path / ADAPTER_CONFIG).read_text())
    except (OSError, ValueError) as e:
        raise WeightsBlobError(f"no readable {ADAPTER_CONFIG} in {path}: {e}") from e
    if not (path / ADAPTER_WEIGHTS).is_file():
        raise WeightsBlobError(f"no {ADAPTER_WEIGHTS} in {path}")
    problems = [
        what
        for what, bad in (
            ("it is not LoRA", config.get("peft_type", "LORA") != "LORA"),
            ("DoRA", bool(config.get("use_dora"))),
            (f"bias {config.get('bias')!r}", config.get("bias", "none") != "none"),
            ("modules_to_save", bool(config.get("modules_to_save"))),
            (
                f"rank {config.get('r')} over the engine's max_lora_rank {max_rank}",
                max_rank is not None and int(config.get("r", 0)) > max_rank,
            ),
        )
        if bad
    ]
    if problems:
        raise WeightsBlobError(f"the adapter in {path} cannot be served: {'; '.join(problems)}")
    return config


def check_weights(manifest: WeightsManifest, model_dir: Path) -> None:
    """Raise `WeightsBlobError` unless `manifest`'s tensors are the model's, with the model's shapes.

    The reference is the model directory's own safetensors files. A full version must hold every tensor; only
    `lm_head.weight` may be missing, and only when `tie_word_embeddings` is set (the engine re-ties it). A delta
    may hold any of them. Checking up front matters because a reload that fails half-way leaves vLLM unusable.
    """
    model_dir = Path(model_dir)
    reference: dict[str, tuple[str, tuple[int, ...]]] = {}
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise WeightsBlobError(f"no *.safetensors in {model_dir} to check {manifest.describe()} against")
    for file in files:
        reference.update(safetensors_header(file))
    tied = bool(json.loads((model_dir / "config.json").read_text()).get("tie_word_embeddings", False))
    got = {t.name: tuple(t.shape) for t in manifest.tensors}
    if tied and TIED_HEAD in got and "model.embed_tokens.weight" in reference:
        reference[TIED_HEAD] = reference["model.embed_tokens.weight"]
    optional = {TIED_HEAD} if tied else set()
    missing = sorted(set(reference) - set(got) - optional) if manifest.kind == "full" else []
    extra = sorted(set(got) - set(reference))
    wrong = sorted(n for n in set(got) & set(reference) if got[n] != reference[n][1])
    if missing or extra or wrong:
        details = "; ".join(
            part
            for part in (
                f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}" if missing else "",
                f"unexpected {extra[:5]}{'...' if len(extra) > 5 else ''}" if extra else "",
                "shape mismatch " + ", ".join(f"{n} {got[n]} vs {reference[n][1]}" for n in wrong[:5]) if wrong else "",
            )
            if part
        )
        raise WeightsBlobError(
            f"{manifest.describe()} does not fit the model in {model_dir}: {details}. The trainer must publish the "
            "same architecture as the engines serve (the job's model_dir)"
        )


def check_source(source: WeightsSource, model_dir: Path, delta_base: tuple[str, int] | None) -> None:
    """Before an engine touches its live weights: the version fits the model (`check_weights`, else
    `WeightsBlobError`), a delta is from the version the engine holds (`delta_base`), and every bucket is in the
    store (else `WeightsTransferError` naming the version and its publisher). Imports the store's tensor side, so
    engines call it, never light tools."""
    from rollart.infra.store.payload import open_store_to_read
    from rollart.infra.store.weight_stream import WeightsTransferError, check_present

    manifest = source.manifest
    check_weights(manifest, model_dir)
    if manifest.kind == "delta" and delta_base != (manifest.job_id, manifest.base_version):
        held = f"v{delta_base[1]} of job {delta_base[0]!r}" if delta_base else "no copy to apply it to"
        raise WeightsTransferError(
            f"{manifest.describe()} needs this engine to hold v{manifest.base_version}, but it holds {held}: "
            "load the full version"
        )
    check_present(open_store_to_read(source.store), manifest)
