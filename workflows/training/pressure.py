"""Admission by engine pressure: an adaptive cap on trajectories in flight, below the async bound's (AIMD).

The async bound caps what is in flight plus buffered at `training.in_flight_limit`; that cap always holds.
Below it, `training.admission.adaptive` keeps a second cap on what is *in flight* — what loads the engines —
that moves with what the engines report with every generation (`EnginePressure`, carried by each trajectory's
result), as TCP's congestion window moves with losses:

- pressure (an engine's KV cache at least `kv_high` full, requests it preempted since its previous report, or
  more than `max_waiting` waiting): the cap is multiplied by `backoff`, at most once per cap's worth of
  finished trajectories (one congestion event seen by many trajectories is one cut);
- headroom (none of that): the cap grows by `increase` trajectories per cap's worth finished (+increase/cap
  each), back toward the bound's.

It starts at the bound's cap, so a job whose engines never report pressure runs as with a fixed cap. It never
goes below one launch (the largest group; a batch in batch mode), so a job always makes progress, nor above
the bound's cap. Pure: it updates the `TrainingState` it is given.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from rollart.contracts.activities import EnginePressure
from rollart.contracts.rollouts import TrajectoryResult
from rollart.contracts.training import ENGINES_KEPT, AdmissionState, TrainingPlan, TrainingState

__all__ = ["ceiling", "current_cap", "floor", "observe", "pressed", "summary"]


def ceiling(plan: TrainingPlan) -> int:
    """The async bound's cap: trajectories in flight plus buffered."""
    return plan.training.in_flight_limit


def floor(plan: TrainingPlan) -> int:
    """The smallest cap that still lets one launch in: a batch in batch mode, else the largest group."""
    if plan.training.rollout_mode == "batch":
        return min(plan.training.batch_size, ceiling(plan))
    return min(max(t.group_size for t in plan.tasks), ceiling(plan))


def current_cap(plan: TrainingPlan, state: TrainingState) -> int | None:
    """Trajectories that may be in flight by engine pressure now; None when admission is not adaptive."""
    if not plan.training.admission.adaptive:
        return None
    cap = state.admission.cap
    return ceiling(plan) if cap is None else max(floor(plan), min(ceiling(plan), math.floor(cap)))


def pressed(plan: TrainingPlan, now: EnginePressure, before: EnginePressure | None) -> bool:
    """Whether an engine's report says it is short of room: KV cache nearly full, new preemptions, or a queue."""
    cfg = plan.training.admission
    if now.kv_usage >= cfg.kv_high:
        return True
    if before is not None and now.preempted > before.preempted:
        return True
    return cfg.max_waiting is not None and now.waiting > cfg.max_waiting


def observe(plan: TrainingPlan, state: TrainingState, results: Iterable[TrajectoryResult]) -> None:
    """Take the engine reports of finished trajectories: remember each engine's last, move the cap (AIMD).

    Call it before the ledger takes the results in: a result whose trajectory is not in flight (a repeated
    report) is not counted twice.
    """
    cfg = plan.training.admission
    adm = state.admission
    for r in results:
        if r.pressure is None or not r.engine_worker or r.trajectory_id not in state.in_flight:
            continue
        before = adm.engines.get(r.engine_worker)
        adm.engines = _remember(adm.engines, r.engine_worker, r.pressure)
        if not cfg.adaptive:
            continue
        cap = float(ceiling(plan)) if adm.cap is None else adm.cap
        if pressed(plan, r.pressure, before):
            if adm.since_cut is None or adm.since_cut >= cap:  # the first sign of this congestion event
                adm.cap, adm.since_cut, adm.cuts = max(float(floor(plan)), cap * cfg.backoff), 0, adm.cuts + 1
                continue
        else:
            step = cfg.increase or max(t.group_size for t in plan.tasks)
            adm.cap = min(float(ceiling(plan)), cap + step / max(cap, 1.0))
        if adm.since_cut is not None:
            adm.since_cut += 1


def _remember(engines: dict[str, EnginePressure], worker: str, p: EnginePressure) -> dict[str, EnginePressure]:
    """The last report of each engine, the most recent ENGINES_KEPT engines (workers come and go)."""
    kept = {w: q for w, q in engines.items() if w != worker}
    kept[worker] = p
    return dict(list(kept.items())[-ENGINES_KEPT:])


def summary(state: AdmissionState) -> EnginePressure | None:
    """The pool-wide picture from each engine's last report: the sums, and the fullest KV cache."""
    if not state.engines:
        return None
    ps = list(state.engines.values())
    return EnginePressure(
        running=sum(p.running for p in ps),
        waiting=sum(p.waiting for p in ps),
        kv_usage=max(p.kv_usage for p in ps),
        preempted=sum(p.preempted for p in ps),
        prefix_queries=sum(p.prefix_queries for p in ps),
        prefix_hits=sum(p.prefix_hits for p in ps),
    )
