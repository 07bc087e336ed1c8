"""A simulated vLLM engine: continuous batching on a roofline, in virtual time, event by event.

Requests wait in a queue ordered by (priority, arrival) — vLLM's priority scheduler; under `fifo` every
priority is 0, so arrival decides. At each iteration boundary the engine admits waiting requests while their
sequences fit `max_num_seqs` and their KV cache fits (a request that does not fit blocks those behind it, as
vLLM's waiting queue does). Every running sequence decodes one token per iteration, and an iteration's time is
the roofline's for the whole batch (`EngineRoofline.iteration_s`): the running requests share each decode step.
A newly admitted prompt is prefilled in its first iteration (only its tokens not in the prefix cache).

Not a loop of iterations: between two events (a request finishing, a new one admitted) the batch does not
change, so the engine computes the iteration time once and sets one timer for the next completion. An arrival
while it decodes moves that timer to the next iteration boundary, where the newcomer joins. That makes an
engine cost a few callbacks per request, whatever the token counts.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.simulate.roofline import EngineRoofline

__all__ = ["Finished", "SimEngine"]

_EPS = 1e-9


@dataclass(frozen=True)
class Finished:
    """A request's end: the weights versions it started and ended under, when it was admitted and finished."""

    version_start: int
    version_end: int
    admitted_at: float
    finished_at: float


@dataclass
class _Request:
    prompt_tokens: int
    new_tokens: int  # prompt tokens not in the prefix cache: what its prefill computes
    output_tokens: int  # per sequence
    n: int
    future: asyncio.Future[Finished]
    done: int = 0
    version_start: int = 0
    admitted_at: float = 0.0

    @property
    def kv_tokens(self) -> int:
        """KV cache it holds at its end: the prompt once (its n samples share it) and each sample's output."""
        return self.prompt_tokens + self.n * self.output_tokens


@dataclass
class _Segment:
    """The iterations planned since the last event: they start at `start`, the first after `prefill_s`."""

    start: float
    prefill_s: float
    step_s: float
    steps: int
    timer: asyncio.TimerHandle | None = None


@dataclass
class SimEngine:
    """One engine of a pool: `roofline` times its iterations, `version()` is the weights version it serves."""

    name: str
    pool: str
    roofline: EngineRoofline
    version: Callable[[], int]
    max_num_seqs: int = 256
    kv_capacity: int = 0  # tokens; 0: the roofline's
    request_s: float = 0.0  # the worker's own work per request (tokenize, store its tokens): serial, like a prefill
    busy_s: float = 0.0
    tokens_out: int = 0
    requests_done: int = 0
    _waiting: list[tuple[int, int, _Request]] = field(default_factory=list)
    _running: list[_Request] = field(default_factory=list)
    _seqs: int = 0
    _waiting_seqs: int = 0
    _kv: int = 0
    _prefill_s: float = 0.0  # prefill of the requests admitted since the last iteration, not yet computed
    _seg: _Segment | None = None
    _arrivals: itertools.count = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        if not self.kv_capacity:
            self.kv_capacity = self.roofline.kv_capacity_tokens

    @property
    def load(self) -> int:
        """Sequences running or waiting: what a router balances."""
        return self._seqs + self._waiting_seqs

    @property
    def running_seqs(self) -> int:
        return self._seqs

    def submit(
        self, prompt_tokens: int, output_tokens: int, *, n: int = 1, priority: int = 0, new_tokens: int | None = None
    ) -> asyncio.Future[Finished]:
        """Queue a request of `n` samples of `output_tokens` each; its future resolves when all are generated."""
        loop = asyncio.get_running_loop()
        req = _Request(
            prompt_tokens=prompt_tokens,
            new_tokens=prompt_tokens if new_tokens is None else new_tokens,
            output_tokens=max(1, output_tokens),
            n=n,
            future=loop.create_future(),
        )
        if req.kv_tokens > self.kv_capacity or n > self.max_num_seqs:
            raise ValueError(f"a request of {req.kv_tokens} KV tokens x {n} never fits engine {self.name}")
        heapq.heappush(self._waiting, (priority, next(self._arrivals), req))
        self._waiting_seqs += n
        if self._seg is None:
            self._admit(loop.time())
            self._plan(loop)
        elif self._fits(req):
            self._wake_at_next_boundary(loop)
        return req.future

    # ------------------------------------------------------------ events

    def _fits(self, req: _Request) -> bool:
        return self._seqs + req.n <= self.max_num_seqs and self._kv + req.kv_tokens <= self.kv_capacity

    def _admit(self, now: float) -> None:
        """Waiting requests into the batch, best (priority, arrival) first, while the head fits."""
        while self._waiting and self._fits(self._waiting[0][2]):
            _, _, req = heapq.heappop(self._waiting)
            self._waiting_seqs -= req.n
            req.version_start, req.admitted_at = self.version(), now
            self._running.append(req)
            self._seqs += req.n
            self._kv += req.kv_tokens
            self._prefill_s += self.roofline.compute_s(req.new_tokens) + self.request_s

    def _plan(self, loop: asyncio.AbstractEventLoop) -> None:
        """Time the batch as it stands and set a timer for its next completion."""
        if not self._running:
            self._seg = None
            return
        steps = min(r.output_tokens - r.done for r in self._running)
        context = sum(r.prompt_tokens + r.n * (r.done + steps / 2) for r in self._running)  # mid-segment
        step_s = self.roofline.iteration_s(self._seqs, context)
        now = loop.time()
        seg = _Segment(start=now, prefill_s=self._prefill_s, step_s=step_s, steps=steps)
        self._prefill_s = 0.0
        seg.timer = loop.call_at(now + seg.prefill_s + steps * step_s, self._on_timer)
        self._seg = seg

    def _wake_at_next_boundary(self, loop: asyncio.AbstractEventLoop) -> None:
        """A newcomer fits: end the segment at the next iteration boundary (if sooner than planned)."""
        seg = self._seg
        assert seg is not None and seg.timer is not None
        now = loop.time()
        first = seg.start + seg.prefill_s
        done = 0 if now < first else int((now - first) / seg.step_s + _EPS) + 1
        if done >= seg.steps:
            return  # the planned end is the next boundary anyway
        seg.timer.cancel()
        seg.timer = loop.call_at(first + done * seg.step_s, self._on_timer)

    def _on_timer(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        seg = self._seg
        assert seg is not None
        steps = min(seg.steps, max(0, int((now - seg.start - seg.prefill_s) / seg.step_s + _EPS)))
        self.busy_s += now - seg.start
        still: list[_Request] = []
        version = self.version()
        for req in self._running:
            req.done += steps
            if req.done >= req.output_tokens:
                self._seqs -= req.n
                self._kv -= req.kv_tokens
                self.tokens_out += req.n * req.output_tokens
                self.requests_done += 1
                if not req.future.done():
                    req.future.set_result(Finished(req.version_start, version, req.admitted_at, now))
            else:
                still.append(req)
        self._running = still
        self._admit(now)
        self._plan(loop)
