"""Admission by engine pressure: an adaptive cap on trajectories in flight, below the async bound's (AIMD).

The async bound caps what is in flight plus buffered at `training.in_flight_limit`; that cap always holds.
Below it, `training.admission.adaptive` keeps a second cap on what is *in flight* — what loads the engines —
that moves with what the engines report with every generation (`EnginePressure`, carried by each trajectory's
result), as TCP's congestion window moves once per round trip. A *round* is a cap's worth of finished
trajectories; at the end of each:

- pressure (the engines preempted more than `max_preempted` requests per trajectory finished in the round —
  their KV cache ran out and they recompute; or an engine reported its KV cache at least `kv_high` full with
  requests waiting; or, with `max_waiting`, more than that many waiting): the cap is multiplied by `backoff`;
- headroom (none of that): the cap grows by `increase` trajectories, back toward the bound's.

A KV cache that is merely full is not pressure (a busy engine's is), nor is a queue while room is left. The cap
starts at the bound's, so a job whose engines never report pressure runs as with a fixed cap; it never goes
below one launch (the largest group; a batch in batch mode), so a job always makes progress, nor above the
bound's cap. Pure: it updates the `TrainingState` it is given.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from rollart.contracts.generation import EnginePressure
from rollart.contracts.rollouts import TrajectoryResult
from rollart.contracts.training import ENGINES_KEPT, AdmissionState, TrainingPlan, TrainingState

__all__ = ["ceiling", "current_cap", "floor", "full", "increase", "observe", "pressed", "summary"]


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


def increase(plan: TrainingPlan) -> int:
    """Trajectories the cap grows by after a round without pressure: `increase`, else a group or a sixteenth of the
    bound's cap, whichever is more (so a cut is made good in a few rounds, not dozens)."""
    cfg = plan.training.admission
    return cfg.increase or max(floor(plan), math.ceil(ceiling(plan) / 16))


def full(plan: TrainingPlan, report: EnginePressure) -> bool:
    """An engine out of room: its KV cache at least `kv_high` full with requests waiting, or (with `max_waiting`)
    more waiting than that."""
    cfg = plan.training.admission
    if report.kv_usage >= cfg.kv_high and report.waiting > 0:
        return True
    return cfg.max_waiting is not None and report.waiting > cfg.max_waiting


def pressed(plan: TrainingPlan, rnd: AdmissionState) -> bool:
    """Whether the round just ended saw the engines short of room: preempting, or full and queuing."""
    return rnd.round_preempted > plan.training.admission.max_preempted * max(rnd.round_done, 1) or rnd.round_full


def observe(plan: TrainingPlan, state: TrainingState, results: Iterable[TrajectoryResult]) -> None:
    """Take the engine reports of finished trajectories: remember each engine's last, count the round's preemptions
    and full engines, and move the cap when a round ends (AIMD).

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
        if before is not None:  # an engine's first report has nothing to compare its count with
            adm.round_preempted += max(0, r.pressure.preempted - before.preempted)
        adm.round_full = adm.round_full or full(plan, r.pressure)
        adm.round_done += 1
        cap = float(ceiling(plan)) if adm.cap is None else adm.cap
        if adm.round_done < cap:
            continue
        if pressed(plan, adm):
            adm.cap, adm.cuts = max(float(floor(plan)), cap * cfg.backoff), adm.cuts + 1
        else:
            adm.cap = min(float(ceiling(plan)), cap + increase(plan))
        adm.round_done, adm.round_preempted, adm.round_full = 0, 0, False


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
