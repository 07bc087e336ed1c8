"""The generate activity: many concurrent calls share one engine, which batches them continuously.

Bulk output (prompt ids, sampled token ids, behaviour logprobs) is written to
the payload store under the caller's `data_key` as a `StoredTurn`; the workflow
gets texts, counts and the policy versions used.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

from temporalio import activity

from rollart.activities.engines.base import Engine, EngineOutput, EngineRequestError
from rollart.activities.engines.chat import PromptFormatError, PromptRenderer
from rollart.activities.engines.conversation import ChatTokens, ConversationError
from rollart.activities.engines.tool_parsing import ToolParsing, UnknownToolParser
from rollart.activities.heartbeat import heartbeating
from rollart.contracts.errors import ErrorType
from rollart.contracts.generation import Completion, GenerateBatchInput, GenerateInput, GenerateResult, WeightsRef
from rollart.contracts.store import StoredCompletion, StoredTurn, whole_prompt
from rollart.infra.store.adapters import fetch_adapter, latest_adapter
from rollart.infra.store.payload import Store, StoreKeyError, key_word
from rollart.infra.store.weights import WeightsSource, latest_weights, read_manifest
from rollart.spec.chat import ChatMessage
from rollart.spec.config import PromptFormat, SamplingParams

__all__ = ["GenerateActivities", "stored_turn"]

log = logging.getLogger(__name__)

HEARTBEAT_EVERY_S = 20.0
"""How often a generation beats when its call sets no heartbeat timeout (in-process calls): a third of GENERATE's
default 60 s (workflows/policies.py)."""


def beat_every_s() -> float:
    """A third of this call's heartbeat timeout (the job's `engine.affinity.heartbeat_s`): two beats may be lost
    before the server takes the engine for dead. The first beat comes after one interval, so a turn shorter than
    that sends none."""
    timeout = activity.info().heartbeat_timeout
    return timeout.total_seconds() / 3 if timeout else HEARTBEAT_EVERY_S


class GenerateActivities:
    """Binds the `generate` activity to this worker's engine and the payload store.

    Weights are pulled: a request that needs a newer policy than the engine holds
    makes the engine stream in the job's latest published version first (once, under a
    lock, whatever the number of waiting requests), so no one has to know which
    generation workers exist. Observations become prompts through the model's chat template per the
    task's `prompt` format (`renderer`; by default the model directory's).

    `queue` is this worker's private queue, named in every result so that a trajectory's next turn comes
    back here (session affinity); a turn that arrives there while more than `max_waiting` requests wait in
    the engine's scheduler is refused (`EngineBusy`) and goes to the shared queue instead.
    A job that publishes LoRA adapters (`trainer.lora`) is served each version as an adapter on the
    base weights, which are then never reloaded (`_ensure_adapter`).
    """

    def __init__(
        self,
        engine: Engine,
        store: Store,
        worker_id: str,
        model_dir: Path,
        renderer: PromptRenderer | None = None,
        queue: str = "",
        max_waiting: int | None = None,
    ) -> None:
        self.engine = engine
        self.renderer = renderer or PromptRenderer(Path(model_dir))
        self.store = store
        self.worker_id = worker_id
        self.model_dir = model_dir  # version 0 of any job: the model dir's own weights
        self._job: str | None = None  # whose weights the engine holds (None: the model dir's)
        self._base_version = 0  # the full weights' version the engine holds (0: the model dir's)
        self._loading = asyncio.Lock()
        self._adapters: Path | None = None  # where fetched adapters wait for the engine (made on first use)
        self.queue = queue
        self.max_waiting = max_waiting
        self.chat = ChatTokens(Path(model_dir))  # chat turns: messages → token ids, incrementally
        self._parsers: dict[str, ToolParsing] = {}
        self._prompts: OrderedDict[str, list[int]] = OrderedDict()  # data_key → whole prompt ids (recent turns)

    @activity.defn(name="generate")
    async def generate(self, inp: GenerateInput) -> GenerateResult:
        """Sample `sampling.n` completions of `prompt`; heartbeats while the engine works."""
        self._refuse_when_busy()
        async with heartbeating(beat_every_s()):
            if inp.weights is not None:
                await self._ensure_version(inp.weights)
            if inp.messages is not None:
                return await self._sample_chat(inp, _request_id())
            return await self._sample(
                inp.prompt, inp.prompt_format, inp.sampling, inp.data_key, _request_id(), inp.priority
            )

    @activity.defn(name="generate_batch")
    async def generate_batch(self, inp: GenerateBatchInput) -> list[GenerateResult]:
        """Sample every prompt concurrently (one turn of a whole GRPO group): one activity, one engine batch."""
        if len(inp.prompts) != len(inp.data_keys):
            raise ErrorType.INVALID_INPUT.error(
                f"generate_batch: {len(inp.prompts)} prompts but {len(inp.data_keys)} data keys"
            )
        self._refuse_when_busy()
        request_id = _request_id()
        async with heartbeating(beat_every_s()):
            if inp.weights is not None:
                await self._ensure_version(inp.weights)
            return list(
                await asyncio.gather(
                    *(
                        self._sample(prompt, inp.prompt_format, inp.sampling, key, f"{request_id}:{i}", inp.priority)
                        for i, (prompt, key) in enumerate(zip(inp.prompts, inp.data_keys))
                    )
                )
            )

    async def _sample(
        self,
        observation: str,
        fmt: PromptFormat | None,
        sampling: SamplingParams,
        data_key: str,
        request_id: str,
        priority: int = 0,
    ) -> GenerateResult:
        """One engine request for `observation` rendered per `fmt`; its tokens and logprobs go to the store."""
        prompt = await self._render(observation, fmt)
        try:
            out = await self.engine.generate(prompt, sampling, request_id, priority)
        except EngineRequestError as e:  # e.g. a prompt over max_model_len: no retry can fix it
            raise ErrorType.REQUEST_REJECTED.error(str(e)) from e
        await asyncio.to_thread(self.store.put, data_key, stored_turn(prompt, out).to_bytes())
        return GenerateResult(
            completions=[
                Completion(text=c.text, num_tokens=len(c.token_ids), finish_reason=c.finish_reason)
                for c in out.completions
            ],
            prompt_tokens=len(out.prompt_ids),
            policy_version=out.policy_version,
            policy_version_end=out.policy_version_end,
            data_key=data_key,
            worker_id=self.worker_id,
            queue=self.queue,
            pressure=self.engine.pressure(),
        )

    async def _sample_chat(self, inp: GenerateInput, request_id: str) -> GenerateResult:
        """One chat turn: the conversation's tokens so far plus the new messages' (never re-tokenized), sampled;
        each completion is read as an assistant message (tool calls parsed). The record holds only the new tokens.
        """
        assert inp.messages is not None
        try:
            prefix, new_ids = await asyncio.to_thread(self._chat_prompt, inp)
            parsing = self._tool_parsing(inp.tool_parser) if inp.tool_parser else None
        except (ConversationError, UnknownToolParser) as e:
            raise ErrorType.INVALID_INPUT.error(str(e)) from e
        except StoreKeyError as e:  # the previous turn's record is gone: this trajectory cannot go on
            raise ErrorType.INVALID_INPUT.error(
                f"chat turn {inp.data_key!r}: the previous turn's record is gone ({e})"
            ) from e
        prompt_ids = prefix + new_ids
        try:
            out = await self.engine.generate(prompt_ids, inp.sampling, request_id, inp.priority)
        except EngineRequestError as e:  # e.g. a conversation grown past max_model_len
            raise ErrorType.REQUEST_REJECTED.error(str(e)) from e
        record = StoredTurn(
            prompt=self.chat.tokenizer.decode(new_ids),
            prompt_ids=new_ids,
            policy_version=out.policy_version,
            policy_version_end=out.policy_version_end,
            completions=stored_turn("", out).completions,
            prefix_key=inp.prefix_key,
            format=2 if inp.prefix_key else 1,
        )
        await asyncio.to_thread(self.store.put, inp.data_key, record.to_bytes())
        self._remember(inp.data_key, prompt_ids)
        completions = []
        for i, c in enumerate(out.completions):
            message = (
                parsing.message(c.text, call_id_prefix=f"{key_word(inp.data_key)}-{i}")
                if parsing
                else ChatMessage(role="assistant", content=c.text)
            )
            completions.append(
                Completion(text=c.text, num_tokens=len(c.token_ids), finish_reason=c.finish_reason, message=message)
            )
        return GenerateResult(
            completions=completions,
            prompt_tokens=len(prompt_ids),
            policy_version=out.policy_version,
            policy_version_end=out.policy_version_end,
            data_key=inp.data_key,
            worker_id=self.worker_id,
            queue=self.queue,
            pressure=self.engine.pressure(),
        )

    def _chat_prompt(self, inp: GenerateInput) -> tuple[list[int], list[int]]:
        """(the conversation's ids before this turn's new messages, their ids with the next reply's start)."""
        assert inp.messages is not None
        if inp.prefix_key is None:
            return [], self.chat.opening(inp.messages, inp.tools)
        previous = StoredTurn.from_bytes(self.store.get(inp.prefix_key))
        if not previous.completions:
            raise ConversationError(f"chat turn {inp.data_key!r}: the previous turn {inp.prefix_key!r} sampled nothing")
        sampled = previous.completions[0].token_ids
        before = self._prompts.get(inp.prefix_key)
        if before is None:
            before = whole_prompt(lambda k: StoredTurn.from_bytes(self.store.get(k)), previous)
        after = bool(sampled) and sampled[-1] == self.chat.tokenizer.eos_token_id
        return before + sampled, self.chat.continuation(inp.messages, after)

    def _remember(self, key: str, prompt_ids: list[int], keep: int = 512) -> None:
        """Keep a turn's whole prompt for its next turn (usually served here: session affinity)."""
        self._prompts[key] = prompt_ids
        self._prompts.move_to_end(key)
        while len(self._prompts) > keep:
            self._prompts.popitem(last=False)

    def _tool_parsing(self, name: str) -> ToolParsing:
        if name not in self._parsers:
            self._parsers[name] = ToolParsing(name, self.chat.tokenizer)
        return self._parsers[name]

    def _refuse_when_busy(self) -> None:
        """A turn pinned here (it came through the private queue) goes elsewhere while the engine is swamped; the
        shared queue's turns are always taken (someone must serve them)."""
        if self.max_waiting is None or not self.queue or activity.info().task_queue != self.queue:
            return
        waiting = self.engine.pressure().waiting
        if waiting > self.max_waiting:
            raise ErrorType.ENGINE_BUSY.error(
                f"engine of {self.worker_id} has {waiting} requests waiting (> {self.max_waiting}): try another"
            )

    async def _render(self, observation: str, fmt: PromptFormat | None) -> str:
        if fmt is None or fmt.chat == "never":
            return observation
        try:
            if not self.renderer.loaded:
                await asyncio.to_thread(self.renderer.load)
            return self.renderer.render(observation, fmt)
        except PromptFormatError as e:
            raise ErrorType.INVALID_INPUT.error(str(e)) from e

    def _current(self, want: WeightsRef) -> bool:
        if self._job is None and self.engine.policy_version == 0:
            self._job = want.job_id  # the model dir's weights are version 0 of every job
        return self._job == want.job_id and self.engine.policy_version >= want.min_version

    async def _ensure_version(self, want: WeightsRef) -> None:
        """Load the job's latest weights if the engine holds another job's or an older version."""
        if self._current(want):
            return
        async with self._loading:
            if self._current(want):
                return
            if await self._ensure_adapter(want):
                return
            switching = self._job != want.job_id
            t0 = time.monotonic()
            source = await asyncio.to_thread(self._latest_source, want.job_id, switching)
            version = source.manifest.version if source else 0
            if version < want.min_version:
                raise ErrorType.WEIGHTS_NOT_PUBLISHED.error(
                    f"job {want.job_id!r} needs policy v{want.min_version} but the store has v{version} published "
                    f"({self.store!r}; weights lost with a Mooncake master are gone unless store.fallback is local)"
                )
            t1 = time.monotonic()
            await self.engine.load_weights(source, version, force=switching)  # None: the model dir's own
            self._job, self._base_version = want.job_id, version
            log.info(
                "loaded policy v%d of %s in %.3fs (manifest %.3fs, stream and load %.3fs%s)",
                version,
                want.job_id,
                time.monotonic() - t0,
                t1 - t0,
                time.monotonic() - t1,
                f": {source.manifest.describe()}" if source else "",
            )

    def _latest_source(self, job_id: str, switching: bool) -> WeightsSource | None:
        """The job's newest version as the engine should take it (its delta, when the engine holds the version
        before), or None before the job's first publish."""
        latest = latest_weights(self.store, job_id)
        if latest is None:
            return None
        manifest = read_manifest(self.store, latest.key)
        if not switching and manifest.delta_key and self.engine.delta_base == (job_id, manifest.version - 1):
            try:
                manifest = read_manifest(self.store, manifest.delta_key)
            except StoreKeyError:
                log.info("delta of %s is gone; loading the full version", manifest.describe())
        return WeightsSource(store=self.store.config, manifest=manifest)

    def _adapters_dir(self) -> Path:
        """A directory of this worker's for the adapters it fetches (the engine deletes each once drained)."""
        if self._adapters is None:
            self._adapters = Path(tempfile.mkdtemp(prefix=f"rollart-adapters-{key_word(self.worker_id)}-"))
        return self._adapters

    async def _ensure_adapter(self, want: WeightsRef) -> bool:
        """Serve the job's newest adapter if it publishes adapters (`trainer.lora`); False if it publishes none.

        The base weights stay as they are, unless another job's full weights are there (then the model dir's are
        loaded once first). An engine built without LoRA cannot serve the job at all: that fails the request,
        not retried, saying how to start the workers.
        """
        if await asyncio.to_thread(latest_adapter, self.store, want.job_id) is None:
            return False
        if not self.engine.serves_adapters:
            raise ErrorType.ADAPTERS_NOT_SERVED.error(
                f"job {want.job_id!r} publishes LoRA adapters (trainer.lora) but this generation worker's engine was "
                "built without LoRA: start the job's generation workers with its spec (`rollart worker --job`), "
                "whose trainer.lora sets engine.max_lora_rank"
            )
        t0 = time.monotonic()
        fetched = await asyncio.to_thread(fetch_adapter, self.store, want.job_id, self._adapters_dir())
        if fetched is None or fetched[0].version < want.min_version:
            if fetched is not None:
                shutil.rmtree(fetched[1], ignore_errors=True)
            raise ErrorType.WEIGHTS_NOT_PUBLISHED.error(
                f"job {want.job_id!r} needs policy v{want.min_version} but its newest adapter in {self.store!r} is "
                f"{'gone' if fetched is None else f'v{fetched[0].version}'} (an adapter lost with a Mooncake master "
                "is gone unless store.fallback is local)"
            )
        ref, path = fetched
        switching = self._job != want.job_id
        if self._base_version != 0:  # another job's trained weights: adapters fit only the model dir's
            await self.engine.load_weights(None, 0, force=True)
            self._base_version = 0
        await self.engine.load_adapter(path, ref.version, force=switching, owned=True)
        self._job = want.job_id
        log.info("serving adapter v%d of %s (%.2fs)", ref.version, want.job_id, time.monotonic() - t0)
        return True


def _request_id() -> str:
    """Unique per attempt, so a retried activity never collides with its own earlier request."""
    info = activity.info()
    return f"{info.workflow_id}:{info.activity_id}:{info.attempt}"


def stored_turn(prompt: str, out: EngineOutput) -> StoredTurn:
    """What the store keeps of one generation: everything a trainer needs to recompute the loss."""
    return StoredTurn(
        prompt=prompt,
        prompt_ids=out.prompt_ids,
        policy_version=out.policy_version,
        policy_version_end=out.policy_version_end,
        completions=[
            StoredCompletion(text=c.text, token_ids=c.token_ids, logprobs=c.logprobs, finish_reason=c.finish_reason)
            for c in out.completions
        ],
    )
