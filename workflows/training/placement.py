"""`generate_pool: auto`: which generation pool each such task's trajectories go to, re-planned as the job runs.

The plan starts as a spread (task i on pool i mod n), so every pool serves some work and its engines report
their rates. Every `training.placement.every_steps` steps it is made again from what the job measured:

- the load: each task's trajectories per step and uncached-prompt and completion tokens per trajectory, over the
  last `window_steps` steps' records (`task_tokens`);
- the rates: each pool's prefill and decode tokens/s per engine, from its engines' own counts (`EnginePressure`,
  carried by every trajectory's result), and its engines, those seen; a pool none of whose engines has reported
  yet takes the plan's prior rates (given, or its GPU's roofline), else the measured pools' mean;
- infra/placement.py's assignment with the shortest step, tasks with a fixed `generate_pool` held where they are
  (they load their pool all the same).

A new plan replaces the current one only when it predicts a step at least `MIN_GAIN` shorter, so noise in the
measurements does not move tasks back and forth. A trajectory keeps the pool it was launched on. Pure and
deterministic: it updates the `TrainingState` it is given.
"""

from __future__ import annotations

from collections.abc import Iterable

from rollart.contracts.rollouts import TrajectoryResult
from rollart.contracts.training import EngineMeter, PlacementState, TrainingPlan, TrainingState
from rollart.infra.config import AUTO_POOL, TaskSpec
from rollart.infra.placement import Placement, PoolRates, TaskLoad, evaluate, plan, reasons

__all__ = ["MIN_GAIN", "due", "loads", "observe", "placed", "pool_rates", "replan", "start"]

MIN_GAIN = 0.05
"""A plan moves tasks only when it predicts a step this much shorter than the current placement's."""

ENGINES_KEPT = 64
"""Engines whose counts are kept (the most recent reports; workers come and go)."""


def start(plan_: TrainingPlan, state: TrainingState) -> None:
    """The first placement, once: the auto tasks spread over the placement pools in turn."""
    if state.placement is not None or not plan_.placement_pools:
        return
    pools = plan_.placement_pools
    auto = [t.name for t in plan_.tasks if t.generate_pool == AUTO_POOL]
    state.placement = PlacementState(
        assignment={name: pools[i % len(pools)] for i, name in enumerate(auto)},
        reasons=[f"spread over {', '.join(pools)} until {plan_.training.placement.every_steps} step(s) are measured"],
    )


def placed(state: TrainingState, task: TaskSpec) -> TaskSpec:
    """`task` as it is launched now: an auto task on its planned pool; any other as it is."""
    if task.generate_pool != AUTO_POOL or state.placement is None:
        return task
    return task.model_copy(update={"generate_pool": state.placement.assignment[task.name]})


def observe(state: TrainingState, results: Iterable[TrajectoryResult]) -> None:
    """Keep each engine's latest rate counts, and its pool, from the results' engine reports."""
    if state.placement is None:
        return
    engines = state.placement.engines
    for r in results:
        p = r.pressure
        if p is None or not r.engine_worker or not r.engine_pool or not (p.prefill_s or p.decode_s):
            continue
        engines.pop(r.engine_worker, None)  # re-inserted last: the most recent are kept
        engines[r.engine_worker] = EngineMeter(
            pool=r.engine_pool,
            prefill_tokens=p.prefill_tokens,
            prefill_s=p.prefill_s,
            decode_tokens=p.decode_tokens,
            decode_s=p.decode_s,
        )
    while len(engines) > ENGINES_KEPT:
        engines.pop(next(iter(engines)))


def due(plan_: TrainingPlan, state: TrainingState) -> bool:
    """Whether a plan is due now, after a step: every `every_steps` steps."""
    if state.placement is None or state.step == 0 or state.placement.planned_at == state.step:
        return False
    return state.step % plan_.training.placement.every_steps == 0


def pool_rates(plan_: TrainingPlan, state: TrainingState, pools: Iterable[str]) -> list[PoolRates]:
    """Each pool's engines and rates per engine: measured where its engines reported, else the prior, else the
    mean of the measured pools (1 token/s each way when nothing is measured: the plan balances tokens)."""
    meters = state.placement.engines.values() if state.placement else []
    measured: dict[str, tuple[int, float | None, float | None]] = {}
    for pool in pools:
        mine = [m for m in meters if m.pool == pool]
        pre_s, dec_s = sum(m.prefill_s for m in mine), sum(m.decode_s for m in mine)
        prefill = sum(m.prefill_tokens for m in mine) / pre_s if pre_s > 0 else None
        decode = sum(m.decode_tokens for m in mine) / dec_s if dec_s > 0 else None
        measured[pool] = (len(mine), prefill, decode)
    fallback = [_mean([m[1] for m in measured.values()]), _mean([m[2] for m in measured.values()])]
    out = []
    for pool, (engines, prefill, decode) in measured.items():
        prior = plan_.placement_rates.get(pool, (fallback[0], fallback[1]))
        out.append(
            PoolRates(
                pool,
                max(1, engines),
                prefill if prefill is not None else (prior[0] or 1.0),
                decode if decode is not None else (prior[1] or 1.0),
            )
        )
    return out


def _mean(xs: list[float | None]) -> float | None:
    known = [x for x in xs if x is not None]
    return sum(known) / len(known) if known else None


def loads(plan_: TrainingPlan, state: TrainingState) -> list[TaskLoad]:
    """Each task's load per step over the last `window_steps` steps' records (tasks that trained in none: left out)."""
    window = state.history[-plan_.training.placement.window :]
    totals: dict[str, list[int]] = {}
    for record in window:
        for task, t in record.task_tokens.items():
            acc = totals.setdefault(task, [0, 0, 0, 0])
            for i, v in enumerate((t.trajectories, t.prompt, t.uncached_prompt, t.completion)):
                acc[i] += v
    return [
        TaskLoad(
            task=task,
            trajectories=n / len(window),
            uncached_prompt_tokens=uncached / n,
            decode_tokens=completion / n,
            prompt_tokens=prompt / n,
        )
        for task, (n, prompt, uncached, completion) in sorted(totals.items())
        if n
    ]


def replan(plan_: TrainingPlan, state: TrainingState) -> bool:
    """Plan again from the measured load and rates; whether a task moved. Fixed tasks on a placement pool count
    as load there; the others, and tasks not measured yet, are left out (an unmeasured auto task stays put)."""
    placement = state.placement
    assert placement is not None
    pools = plan_.placement_pools
    fixed = {t.name: t.generate_pool for t in plan_.tasks if t.generate_pool != AUTO_POOL}
    measured = [x for x in loads(plan_, state) if x.task in placement.assignment or fixed.get(x.task) in pools]
    placement.plans += 1
    placement.planned_at = state.step
    if not any(x.task in placement.assignment for x in measured):
        placement.reasons = ["no auto task has trained yet: placement kept"]
        _record(state)
        return False
    rates = pool_rates(plan_, state, pools)
    allowed = {x.task: [fixed[x.task]] if x.task in fixed else pools for x in measured}
    current = evaluate({x.task: fixed.get(x.task) or placement.assignment[x.task] for x in measured}, measured, rates)
    chosen = plan(measured, rates, allowed)
    moved = chosen.makespan_s < current.makespan_s * (1 - MIN_GAIN) and chosen.assignment != current.assignment
    kept: Placement = chosen if moved else current
    if moved:
        placement.assignment |= {t: p for t, p in chosen.assignment.items() if t in placement.assignment}
        placement.moves += 1
    placement.makespan_s = round(kept.makespan_s, 6)
    placement.rates = {
        r.pool: (r.engines, round(r.prefill_tokens_per_s, 3), round(r.decode_tokens_per_s, 3)) for r in rates
    }
    gain = current.makespan_s / max(chosen.makespan_s, 1e-12)
    verdict = "moved" if moved else f"kept (the best plan gains {gain:.2f}x, below {1 + MIN_GAIN:.2f}x)"
    placement.reasons = [*reasons(kept, measured, current if moved else None), verdict]
    _record(state)
    return moved


def _record(state: TrainingState) -> None:
    """The plan in the record of the step it followed (metrics.jsonl, the report)."""
    if state.placement is not None and state.history and state.history[-1].step + 1 == state.step:
        state.history[-1].placement_plan = [state.placement.describe(), *state.placement.reasons]
