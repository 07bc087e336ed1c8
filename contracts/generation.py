"""Typed messages of the generation activities: a request, a batch of them, what an engine answers and
reports of itself, and which engines of a pool are alive.

Workflows import this module (pydantic models only), never the engines. New fields get defaults so that running
histories keep decoding.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rollart.spec.chat import ChatMessage
from rollart.spec.config import PromptFormat, SamplingParams

__all__ = [
    "Completion",
    "EnginePressure",
    "FinishReason",
    "GenerateBatchInput",
    "GenerateInput",
    "GenerateResult",
    "LiveEnginesInput",
    "LiveEnginesResult",
    "WeightsRef",
]


class _Message(BaseModel):
    model_config = ConfigDict(frozen=True)


class WeightsRef(_Message):
    """Which policy a generation must use at least: the engine loads a newer published version if behind."""

    job_id: str
    min_version: int = Field(0, ge=0)


class GenerateInput(_Message):
    """One generation request; bulk output goes to the store under `data_key`."""

    prompt: str
    sampling: SamplingParams
    data_key: str
    weights: WeightsRef | None = None
    prompt_format: PromptFormat | None = None
    """How `prompt` (an observation) reaches the model: through its chat template or raw (None: raw)."""
    messages: list[ChatMessage] | None = None
    """A chat turn: the messages new since the previous turn (every message on the first), rendered by the
    model's chat template and appended to the conversation's tokens (`prompt` is their text, for display)."""
    tools: list[dict[str, Any]] | None = None
    """A chat turn's tools (JSON schemas), rendered into the first turn's prompt."""
    prefix_key: str | None = None
    """A chat turn after the first: the previous turn's record. This turn's prompt is that turn's prompt, then its
    sampled ids, then the new messages' tokens: the conversation is never re-tokenized."""
    tool_parser: str | None = None
    """The vLLM tool parser that reads tool calls in a chat turn's completions (`hermes` for Qwen); None: none."""
    priority: int = 0
    """Its rank among requests waiting on an engine that schedules by priority: lower first (workflows/driver/
    priority.py); ignored by one serving in arrival order."""


class GenerateBatchInput(_Message):
    """Several prompts sampled together (one per group member); prompt i's output goes under `data_keys[i]`."""

    prompts: list[str] = Field(min_length=1)
    sampling: SamplingParams
    data_keys: list[str] = Field(min_length=1)
    weights: WeightsRef | None = None
    prompt_format: PromptFormat | None = None
    priority: int = 0
    """Every prompt's rank among requests waiting on the engine (as GenerateInput's)."""


FinishReason = Literal["stop", "length", "abort", "error", "repetition", "None"]
"""Why a completion ended: a stop string or EOS, `max_tokens`, an aborted request, an engine error, a repetition
detector (vLLM's reasons; the HF engine gives stop or length). "None" is in records and histories of vLLM outputs
that had no reason, which the vLLM engine once wrote as `str(None)`; it writes "abort" for those now."""


class Completion(_Message):
    """The compact part of one sampled completion (tokens and logprobs stay in the store)."""

    text: str
    num_tokens: int
    finish_reason: FinishReason
    message: ChatMessage | None = None
    """A chat turn's completion as an assistant message, its tool calls parsed (`GenerateInput.tool_parser`)."""


class EnginePressure(_Message):
    """How loaded an engine is, as it reports with each generation: a few numbers, never per token.

    `running` / `waiting`: requests in its scheduler; `kv_usage`: the share of its KV cache in use;
    `preempted`: requests it has preempted since it started (KV cache ran out); `prefix_queries` /
    `prefix_hits`: prompt tokens looked up in its prefix cache since it started, and found there.
    `prefill_tokens` / `prefill_s`: prompt tokens it computed (not found in a prefix cache) since it started, and
    the seconds of its steps that prefilled; `decode_tokens` / `decode_s`: tokens it generated in steps that only
    decoded, their seconds and those steps (`decode_tokens / decode_steps` is the batch it decoded at);
    `max_batch`: the sequences it can decode at once (0: one request at a time). Their ratios are its measured
    rates, by which `generate_pool: auto` places tasks (workflows/training/placement.py). The HF fallback
    reports only these (and zeros for the rest).
    """

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    preempted: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    prefill_tokens: int = 0
    prefill_s: float = 0.0
    decode_tokens: int = 0
    decode_s: float = 0.0
    decode_steps: int = 0
    max_batch: int = 0

    @property
    def prefix_hit_rate(self) -> float | None:
        """Prompt tokens found in the prefix cache, as a share of those looked up (None before any lookup)."""
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else None


class GenerateResult(_Message):
    """Compact result of a generation: the texts, the policy versions used, where the tokens are, and the engine.

    `queue` is the private queue of the worker that served it (`h800@<worker>`): a trajectory's next turn goes
    there, where its prefix is cached (`engine.affinity`); "" when the worker has none.
    """

    completions: list[Completion]
    prompt_tokens: int
    policy_version: int
    policy_version_end: int
    data_key: str
    worker_id: str = ""
    queue: str = ""
    pressure: EnginePressure | None = None


class LiveEnginesInput(_Message):
    """Which engines of a generation pool are alive now (a single-turn wave splits across them)."""

    pool: str
    queue_prefix: str = ""


class LiveEnginesResult(_Message):
    """The private queues of the pool's workers whose heartbeats are current, sorted; empty when the server keeps
    no heartbeats (then nobody knows, and the wave goes to the shared queue whole)."""

    queues: list[str] = Field(default_factory=list)
