"""vLLM's scheduler numbers, read in process: a stat logger that keeps the last snapshot and the running counts.

`AsyncLLM` has no call that returns its metrics; it hands them to its stat loggers instead, once per engine
step (`record`): the scheduler's running and waiting requests, its KV cache use and this step's prefix-cache
lookups, and the requests preempted in this step. `EngineStats.factory` is what `AsyncLLM.from_engine_args(...,
stat_loggers=[...])` takes; vLLM then records stats even with `disable_log_stats=True`. Our logger keeps no
Prometheus state (vLLM adds its own Prometheus logger beside it, whose registry is process-wide).

Imports vLLM: only the vLLM engine imports this module, when it starts.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.metrics.loggers import StatLoggerBase

from rollart.activities.engines.base import RateMeter
from rollart.contracts.generation import EnginePressure

__all__ = ["EngineStats"]

IDLE_GAP_S = 5.0
"""A gap between two engine steps longer than this was a pause (a weight update), not a step: not counted."""


class EngineStats:
    """The running counts of one engine, fed by its stat loggers (one per vLLM engine core)."""

    def __init__(self, max_num_seqs: int = 0) -> None:
        self.running = 0
        self.waiting = 0
        self.kv_usage = 0.0
        self.preempted = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.rates = RateMeter(max_batch=max_num_seqs)
        self._last_step_at: float | None = None

    def snapshot(self) -> EnginePressure:
        return self.rates.report(self._pressure())

    def _pressure(self) -> EnginePressure:
        return EnginePressure(
            running=self.running,
            waiting=self.waiting,
            kv_usage=round(self.kv_usage, 4),
            preempted=self.preempted,
            prefix_queries=self.prefix_queries,
            prefix_hits=self.prefix_hits,
        )

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        """One engine step's numbers: the scheduler's state replaces the last, the counts add up."""
        busy = self.running > 0  # requests were running since the step before: the time between was a step's
        if scheduler_stats is not None:
            self.running = scheduler_stats.num_running_reqs
            self.waiting = scheduler_stats.num_waiting_reqs
            self.kv_usage = float(scheduler_stats.kv_cache_usage)
            prefix = scheduler_stats.prefix_cache_stats
            if prefix is not None:
                self.prefix_queries += prefix.queries
                self.prefix_hits += prefix.hits
        if iteration_stats is not None:
            self.preempted += iteration_stats.num_preempted_reqs
            self._time_step(iteration_stats, busy)

    def _time_step(self, stats: Any, busy: bool) -> None:
        """Its rates: the time since the step before, when requests ran all along, is a prefill step's when it
        computed prompt tokens, else a decode step's (a mixed step counts as prefill: its decodes ride along)."""
        at = float(stats.iteration_timestamp)
        gap = None if self._last_step_at is None else at - self._last_step_at
        self._last_step_at = at
        prompt = getattr(stats, "prompt_token_stats", None)
        computed = getattr(prompt, "computed", None)
        computed = stats.num_prompt_tokens if computed is None else computed
        if not busy and computed and stats.time_to_first_tokens_iter:  # a prefill on an idle engine: its TTFT
            gap = max(stats.time_to_first_tokens_iter)
        elif not busy or gap is None:
            return
        if not 0 < gap <= IDLE_GAP_S:
            return
        if computed:
            self.rates.prefill_tokens += computed
            self.rates.prefill_s += gap
        elif stats.num_generation_tokens:
            self.rates.decode_tokens += stats.num_generation_tokens
            self.rates.decode_s += gap
            self.rates.decode_steps += 1

    def factory(self, vllm_config: Any, engine_index: int = 0) -> StatLoggerBase:
        """vLLM's per-engine stat logger factory: a logger that feeds these counts."""
        return _Logger(self, vllm_config, engine_index)


class _Logger(StatLoggerBase):
    def __init__(self, stats: EngineStats, vllm_config: Any, engine_index: int = 0) -> None:
        self.stats = stats

    def record(
        self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
    ) -> None:
        self.stats.record(scheduler_stats, iteration_stats)

    def log_engine_initialized(self) -> None:
        pass
