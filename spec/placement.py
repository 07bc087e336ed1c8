"""Automatic affinity: which generation pool each task's turns go to, chosen to shorten a step.

A step's generation is, per pool, the prefill of its tasks' uncached prompt tokens and the decode of their
completion tokens, spread over the pool's engines. With prefix caching a multi-turn trajectory's later turns
prefill only what is new since the turn before (arXiv 2605.26297), so routing counts uncached tokens, not
turns. The plan minimises the step's makespan, the busiest pool's seconds: every assignment when there are few
(tasks × pools small, as in a job's spec), else longest-first greedy and then single moves while one helps.
Pure and deterministic: the CLI, the benches and the simulator call it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["Placement", "PoolRates", "TaskLoad", "evaluate", "plan", "reasons", "size_pools"]

EXHAUSTIVE_LIMIT = 100_000
"""Assignments tried one by one up to this many (8 tasks on 4 pools is 65,536); beyond, greedy + local moves."""


@dataclass(frozen=True)
class TaskLoad:
    """One task's generation work per step: trajectories, and tokens per trajectory."""

    task: str
    trajectories: float
    uncached_prompt_tokens: float
    decode_tokens: float
    prompt_tokens: float = 0.0  # all prompt tokens, cached or not (shown, not planned on)


@dataclass(frozen=True)
class PoolRates:
    """One generation pool: its engines, and what each sustains (tokens/s)."""

    pool: str
    engines: int
    prefill_tokens_per_s: float
    decode_tokens_per_s: float

    def seconds(self, load: TaskLoad) -> float:
        """The pool's wall seconds for `load`'s step, its engines sharing the work."""
        work = load.uncached_prompt_tokens / self.prefill_tokens_per_s + load.decode_tokens / self.decode_tokens_per_s
        return load.trajectories * work / max(1, self.engines)


@dataclass(frozen=True)
class Placement:
    """Task → pool, and each pool's seconds per step under it."""

    assignment: dict[str, str]
    pool_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def makespan_s(self) -> float:
        """The step's generation time: its busiest pool's."""
        return max(self.pool_seconds.values(), default=0.0)


def evaluate(assignment: Mapping[str, str], loads: Sequence[TaskLoad], rates: Sequence[PoolRates]) -> Placement:
    """Each pool's seconds when every task runs where `assignment` says."""
    by_pool = {r.pool: r for r in rates}
    missing = sorted({assignment[t.task] for t in loads} - set(by_pool))
    if missing:
        raise ValueError(f"no rates for pool(s) {missing}; pools with rates: {sorted(by_pool)}")
    seconds = dict.fromkeys(by_pool, 0.0)
    for load in loads:
        pool = assignment[load.task]
        seconds[pool] += by_pool[pool].seconds(load)
    return Placement(dict(assignment), seconds)


def plan(
    loads: Sequence[TaskLoad], rates: Sequence[PoolRates], allowed: Mapping[str, Sequence[str]] | None = None
) -> Placement:
    """The assignment with the shortest makespan; `allowed` limits a task's pools (default: every pool)."""
    if not rates:
        raise ValueError("no generation pools to place tasks on")
    pools = [r.pool for r in rates]
    choices = [list((allowed or {}).get(t.task, pools)) for t in loads]
    for load, options in zip(loads, choices):
        if not options:
            raise ValueError(f"task {load.task!r} may run on no pool")
    if math.prod(len(c) for c in choices) <= EXHAUSTIVE_LIMIT:
        candidates = (dict(zip((t.task for t in loads), combo)) for combo in itertools.product(*choices))
        return min((evaluate(a, loads, rates) for a in candidates), key=_rank)
    return _improve(_greedy(loads, rates, choices), loads, rates, choices)


def _rank(p: Placement) -> tuple[float, float, tuple[str, ...]]:
    """Shortest makespan, then least total pool time, then by name: one answer, whatever the order tried."""
    return (round(p.makespan_s, 12), round(sum(p.pool_seconds.values()), 12), tuple(sorted(p.assignment.items())))


def _greedy(loads: Sequence[TaskLoad], rates: Sequence[PoolRates], choices: list[list[str]]) -> Placement:
    """Longest task first, each onto the pool where it would finish earliest."""
    by_pool = {r.pool: r for r in rates}
    seconds = dict.fromkeys(by_pool, 0.0)
    assignment: dict[str, str] = {}
    order = sorted(range(len(loads)), key=lambda i: -min(by_pool[p].seconds(loads[i]) for p in choices[i]))
    for i in order:
        best = min(choices[i], key=lambda p: (seconds[p] + by_pool[p].seconds(loads[i]), p))
        assignment[loads[i].task] = best
        seconds[best] += by_pool[best].seconds(loads[i])
    return evaluate(assignment, loads, rates)


def _improve(
    current: Placement, loads: Sequence[TaskLoad], rates: Sequence[PoolRates], choices: list[list[str]]
) -> Placement:
    """Move one task at a time while a move shortens the makespan."""
    improved = True
    while improved:
        improved = False
        for load, options in zip(loads, choices):
            for pool in options:
                trial = evaluate(current.assignment | {load.task: pool}, loads, rates)
                if _rank(trial) < _rank(current):
                    current, improved = trial, True
    return current


def reasons(chosen: Placement, loads: Sequence[TaskLoad], declared: Placement | None = None) -> list[str]:
    """Why each task goes where it goes, in words for `rollart plan` and the run report."""
    lines = []
    for load in loads:
        pool = chosen.assignment[load.task]
        lines.append(
            f"{load.task} -> {pool}: {load.trajectories:g} trajectories/step, "
            f"{load.uncached_prompt_tokens:.0f} uncached prompt + {load.decode_tokens:.0f} decode tokens each"
        )
    busiest = max(chosen.pool_seconds, key=lambda p: chosen.pool_seconds[p], default=None)
    if busiest is not None:
        loads_s = ", ".join(f"{p} {s:.2f} s" for p, s in chosen.pool_seconds.items())
        lines.append(f"pool seconds per step: {loads_s}; the step waits for {busiest}")
    if declared is not None and declared.makespan_s > 0:
        gain = declared.makespan_s / max(chosen.makespan_s, 1e-12)
        lines.append(
            f"declared placement: {declared.makespan_s:.2f} s per step; "
            f"this plan: {chosen.makespan_s:.2f} s ({gain:.2f}x)"
        )
    return lines


def size_pools(
    loads: Sequence[TaskLoad], per_engine: Sequence[PoolRates], assignment: Mapping[str, str], step_s: float
) -> dict[str, int]:
    """Engines each pool needs so that its share of a step takes at most `step_s` (`per_engine`: one engine's rates)."""
    if step_s <= 0:
        raise ValueError(f"step_s must be positive, got {step_s}")
    single = [PoolRates(r.pool, 1, r.prefill_tokens_per_s, r.decode_tokens_per_s) for r in per_engine]
    one_engine = evaluate(assignment, loads, single).pool_seconds
    return {pool: math.ceil(seconds / step_s) if seconds else 0 for pool, seconds in one_engine.items()}
