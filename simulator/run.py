"""One simulated run: a job's plan on a cluster of pools, played in virtual time, summed up in one row."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from rollart.contracts.training import PlacementState, TrainingPlan
from rollart.simulator.calls import SimCalls
from rollart.simulator.clock import run_virtual
from rollart.simulator.cluster import Cluster, PoolSpec
from rollart.simulator.models import Overheads, TaskProfile, TrainerModel
from rollart.simulator.roofline import ModelSpec
from rollart.simulator.shell import Outcome, SimTraining
from rollart.simulator.temporal_load import temporal_load

__all__ = ["Setup", "simulate", "summarize"]


@dataclass(frozen=True)
class Setup:
    """Everything one simulated run needs: the job's plan, the pools, the model, the world's models."""

    name: str
    plan: TrainingPlan
    pools: list[PoolSpec]
    model: ModelSpec
    profiles: dict[str, TaskProfile]
    trainer: TrainerModel
    overheads: Overheads = field(default_factory=Overheads)
    horizon_s: float | None = None
    seed: int = 0
    exact: bool = False  # the wait condition from the ledger's own functions (slow at scale), not the index
    start_placement: dict[str, str] | None = None  # generate_pool: auto tasks' first pools (None: the spread)


def simulate(setup: Setup, progress_every_s: float | None = None) -> tuple[Outcome, dict[str, Any]]:
    """Play `setup` to its steps or its horizon; the outcome and its row of measurements. With
    `progress_every_s`, a line every that many simulated seconds: where the run is, and its wall time so far."""
    missing = {t.env for t in setup.plan.tasks} - set(setup.profiles)
    if missing:
        raise ValueError(f"no TaskProfile for env(s) {', '.join(sorted(missing))}: add one to the setup's profiles")
    holder: list[SimTraining] = []
    cluster = Cluster(setup.pools, setup.model, version=lambda: holder[0].version, seed=setup.seed)
    calls = SimCalls(cluster, setup.profiles, setup.overheads, random.Random(setup.seed))
    training = SimTraining(setup.plan, calls, setup.trainer, setup.horizon_s, exact=setup.exact)
    holder.append(training)
    if setup.start_placement is not None:
        given = ", ".join(f"{t} → {p}" for t, p in sorted(setup.start_placement.items()))
        training.s.placement = PlacementState(assignment=dict(setup.start_placement), reasons=[f"given: {given}"])
    t0, c0 = time.perf_counter(), time.process_time()
    if progress_every_s:
        training.on_start = lambda: _progress(training, progress_every_s, t0)
    out = run_virtual(training.run())
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    row = summarize(setup, out, cluster, calls, wall)
    row["cpu_s"] = cpu  # this process's CPU: the wall time on a machine of its own (this one is shared)
    return out, row


def _progress(training: SimTraining, every_s: float, t0: float) -> None:
    """Print where the run is now, and again in `every_s` simulated seconds."""
    loop = asyncio.get_running_loop()
    s = training.s
    if loop.time() > 0:
        print(
            f"    sim {loop.time() / 60:5.1f} min: step {s.step}, {len(s.in_flight):,} in flight, "
            f"{s.trained:,} trained, wall {time.perf_counter() - t0:.0f} s, cpu {time.process_time():.0f} s",
            flush=True,
        )
    loop.call_later(every_s, _progress, training, every_s, t0)


def summarize(setup: Setup, out: Outcome, cluster: Cluster, calls: SimCalls, wall_s: float) -> dict[str, Any]:
    """The row a run reports: throughput, step time, tail latency, utilisation, the ledger, and what it cost."""
    s, t = out.state, setup.plan.training
    elapsed = out.elapsed_s or 1e-9
    steps = len(out.step_ends)
    gaps = [b - a for a, b in zip([0.0, *out.step_ends], out.step_ends)]
    traj = sorted(out.trajectory_s)
    row: dict[str, Any] = {
        "name": setup.name,
        "rollout_mode": t.rollout_mode,
        "async_bound": t.async_bound,
        "sim_s": elapsed,
        "steps": steps,
        "step_s": statistics.fmean(gaps) if gaps else None,
        "steps_per_hour": steps * 3600.0 / elapsed,
        "trajectories_per_s": out.completed / elapsed,
        "trained_per_s": s.trained / elapsed,
        "trajectory_p50_s": traj[len(traj) // 2] if traj else None,
        "trajectory_p99_s": traj[min(len(traj) - 1, int(0.99 * len(traj)))] if traj else None,
        "started": s.started,
        "trained": s.trained,
        "dropped": s.dropped,
        "failed": s.failed,
        "in_flight_end": len(s.in_flight),
        "buffered_end": len(s.buffer),
        "ledger_balanced": s.ledger_balanced,
        "busy_trainer": out.train_busy_s / elapsed,
        "calls": sum(calls.counts.calls.values()),
        "units": out.units,
        "reports": out.reports,
        "wall_s": wall_s,
        "gpus": cluster.gpus + setup.trainer.gpus,
    }
    row.update({f"busy_{pool}": share for pool, share in cluster.utilisation(elapsed).items()})
    row |= temporal_load(row["calls"], out.units, out.reports, steps, elapsed, setup.plan.limits)
    if s.placement is not None:  # generate_pool: auto: where the tasks started and ended, and the moves between
        row |= {
            "placement_start": out.placements[0][2] if out.placements else {},
            "placement_end": dict(s.placement.assignment),
            "placement_moves": s.placement.moves,
            "placement_plans": s.placement.plans,
            "placement_timeline": [
                {"sim_s": round(t, 1), "step": step, "assignment": a} for t, step, a in out.placements
            ],
            "placement_rates": {p: list(r) for p, r in s.placement.rates.items()},
            "placement_reasons": list(s.placement.reasons),
        }
    return row
