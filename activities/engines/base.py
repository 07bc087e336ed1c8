"""The engine contract: what a generation worker needs from an inference engine.

One method (`generate`) plus a lifecycle (`start`, `shutdown`). Engines return
token ids and the *behaviour* logprob of every sampled token, because the
trainer needs both (importance ratios against the policy that actually
sampled), and they stamp every output with the policy version at the start
and end of the request so weight swaps in the middle of a generation are
visible downstream.

This module is light (no torch, no vLLM) so it can be imported anywhere.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from rollart.infra.config import SamplingParams

__all__ = [
    "Completion",
    "Engine",
    "EngineDeadError",
    "EngineError",
    "EngineOutput",
]


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
    finish_reason: str  # "stop" | "length" | "abort" ...


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
    async def generate(self, prompt: str, sampling: SamplingParams, request_id: str) -> EngineOutput:
        """Sample `sampling.n` completions of `prompt`.

        Raises `EngineError` if this request failed, `EngineDeadError` if the
        engine is gone. Cancelling the awaiting task aborts the request.
        """

    @abstractmethod
    async def shutdown(self) -> None:
        """Release the model and any background processes; safe to call twice."""

    @abstractmethod
    def tokens_generated(self) -> int:
        """Running count of generated tokens (all completions), for tokens/s metrics."""
