"""`generate_pool: auto`: which generation pool each such task's trajectories go to, re-planned as the job runs.

The plan starts as a spread (task i on pool i mod n), so every pool serves some work and its engines report
their rates. Every `training.placement.every_steps` steps it is made again from what the job measured since the
last plan:

- the load: each task's trajectories per step, and uncached-prompt and completion tokens per trajectory, over
  every trajectory that finished (trained, failed or dropped later: each was generated);
- the engines: those of each pool that reported since the last plan, at least as many as the spec gives
  (`training.placement.engines`, else the pool's kubernetes replicas);
- the rates: each pool's prefill and decode tokens/s per engine, from its engines' own counts (`EnginePressure`,
  carried by every trajectory's result). A decode rate is measured at the batch the engine ran, so it is scaled
  to the engine's `max_batch` (a decode step reads the weights once for the whole batch: its time barely grows
  with the batch), or a lightly loaded pool would look slow and never be given work. A pool none of whose
  engines has reported takes the plan's prior rates (given, or its GPU's roofline), else the measured mean;
- spec/placement.py's assignment with the shortest step, tasks with a fixed `generate_pool` held where they are
  (they load their pool all the same).

A new plan replaces the current one only when it predicts a step at least `MIN_GAIN` shorter, so noise in the
measurements does not move tasks back and forth. A trajectory keeps the pool it was launched on. Pure and
deterministic: it updates the `TrainingState` it is given.
"""

from __future__ import annotations

from collections.abc import Iterable

from rollart.contracts.generation import EnginePressure
from rollart.contracts.rollouts import TrajectoryResult
from rollart.contracts.training import EngineMeter, PlacementState, TaskTokens, TrainingPlan, TrainingState
from rollart.spec.config import AUTO_POOL, TaskSpec
from rollart.spec.placement import Placement, PoolRates, TaskLoad, evaluate, plan, reasons

__all__ = ["MIN_GAIN", "decode_capacity", "due", "loads", "observe", "placed", "pool_rates", "replan", "start"]

MIN_GAIN = 0.05
"""A plan moves tasks only when it predicts a step this much shorter than the current placement's."""

METERS_PER_POOL = 32
"""Engines per pool whose counts the rates are taken from (the most recent reports; workers come and go)."""


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
    """Each finished trajectory's tokens into its task's load, and its engine's latest counts into its pool's.

    Call it before the ledger takes the results: a repeated report (its trajectory no longer in flight) is not
    counted twice."""
    if state.placement is None:
        return
    p = state.placement
    for r in results:
        if r.trajectory_id not in state.in_flight:
            continue
        p.finished.setdefault(r.task, TaskTokens()).add(r.prompt_tokens, r.uncached_prompt_tokens, r.completion_tokens)
        if (
            r.pressure is not None
            and r.engine_worker
            and r.engine_pool
            and (r.pressure.prefill_s or r.pressure.decode_s)
        ):
            _meter(p, r.engine_worker, r.engine_pool, r.pressure)


def _meter(p: PlacementState, worker: str, pool: str, report: EnginePressure) -> None:
    seen = p.seen.setdefault(pool, [])
    if worker not in seen:
        seen.append(worker)
    p.engines.pop(worker, None)  # re-inserted last: the most recent are kept
    p.engines[worker] = EngineMeter(pool=pool, counts=report)
    mine = [w for w, m in p.engines.items() if m.pool == pool]
    for w in mine[: max(0, len(mine) - METERS_PER_POOL)]:
        del p.engines[w]


def due(plan_: TrainingPlan, state: TrainingState) -> bool:
    """Whether a plan is due now, after a step: every `every_steps` steps."""
    if state.placement is None or state.step == 0 or state.placement.planned_at == state.step:
        return False
    return state.step % plan_.training.placement.every_steps == 0


def pool_rates(plan_: TrainingPlan, state: TrainingState, pools: Iterable[str]) -> list[PoolRates]:
    """Each pool's engines and rates per engine: measured where its engines reported, else the prior, else the
    mean of the measured pools (1 token/s each way when nothing is measured: the plan balances tokens)."""
    p = state.placement
    meters = list(p.engines.values()) if p else []
    measured: dict[str, tuple[int, float | None, float | None]] = {}
    for pool in pools:
        mine = [m.counts for m in meters if m.pool == pool]
        engines = _engines(plan_, p, pool)
        pre_s = sum(m.prefill_s for m in mine)
        prefill = sum(m.prefill_tokens for m in mine) / pre_s if pre_s > 0 else None
        decoding = [m for m in mine if m.decode_s > 0]
        decode = sum(decode_capacity(m) for m in decoding) / len(decoding) if decoding else None
        measured[pool] = (engines, prefill, decode)
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


def _engines(plan_: TrainingPlan, p: PlacementState | None, pool: str) -> int:
    """A pool's engines: those that reported since the last plan, at least as many as the spec gives; none
    reported: as many as at the last plan, else the spec's, else 1."""
    seen = len(p.seen.get(pool, [])) if p else 0
    declared = plan_.placement_engines.get(pool, 0)
    last = p.pool_engines.get(pool, 0) if p else 0
    return max(seen, declared) or last or 1


def decode_capacity(m: EnginePressure) -> float:
    """An engine's decode tokens/s at its full batch: the rate it measured, at the batch it decoded at, scaled to
    its `max_batch` (unknown batch or one request at a time: the rate as measured)."""
    rate = m.decode_tokens / m.decode_s
    batch = m.decode_tokens / m.decode_steps if m.decode_steps else 0.0
    return rate * m.max_batch / batch if m.max_batch and 0 < batch < m.max_batch else rate


def _mean(xs: list[float | None]) -> float | None:
    known = [x for x in xs if x is not None]
    return sum(known) / len(known) if known else None


def loads(state: TrainingState) -> list[TaskLoad]:
    """Each task's load per step since the last plan: every trajectory that finished, and its tokens."""
    p = state.placement
    if p is None:
        return []
    steps = max(1, state.step - p.since_step)
    return [
        TaskLoad(
            task=task,
            trajectories=t.trajectories / steps,
            uncached_prompt_tokens=t.uncached_prompt / t.trajectories,
            decode_tokens=t.completion / t.trajectories,
            prompt_tokens=t.prompt / t.trajectories,
        )
        for task, t in sorted(p.finished.items())
        if t.trajectories
    ]


def replan(plan_: TrainingPlan, state: TrainingState) -> bool:
    """Plan again from the measured load and rates; whether a task moved. Fixed tasks on a placement pool count
    as load there; the others, and tasks not measured yet, are left out (an unmeasured auto task stays put)."""
    placement = state.placement
    assert placement is not None
    pools = plan_.placement_pools
    fixed = {t.name: t.generate_pool for t in plan_.tasks if t.generate_pool != AUTO_POOL}
    measured = [x for x in loads(state) if x.task in placement.assignment or fixed.get(x.task) in pools]
    rates = pool_rates(plan_, state, pools)
    placement.plans += 1
    placement.planned_at = state.step
    placement.pool_engines = {r.pool: r.engines for r in rates}
    placement.seen, placement.finished, placement.since_step = {}, {}, state.step
    if not any(x.task in placement.assignment for x in measured):
        placement.reasons = ["no auto task has finished a trajectory since the last plan: placement kept"]
        _record(state)
        return False
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
