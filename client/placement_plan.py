"""`rollart plan` / `rollart k8s plan`: which generation pool each task should use, from a run's token profile.

A run's metrics.jsonl records each task's trajectories and tokens per step (`task_tokens`: prompt, uncached
prompt, completion). Each generation pool's engine rates come from its GPUs' roofline (spec/hardware.py: the
pool's `gpu.product`, `gpu.count` or the engine's tensor-parallel size, the model's parameter count) or from
rates measured elsewhere (`rates`). spec/placement.py then finds the assignment with the shortest step and,
given a step time, the engines each pool needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rollart.client.plot import read_jsonl
from rollart.spec.config import AUTO_POOL, JobSpec
from rollart.spec.hardware import engine_rates
from rollart.spec.placement import Placement, PoolRates, TaskLoad, evaluate, plan, reasons, size_pools

__all__ = ["PlacementReport", "job_rates", "plan_from_run", "profile"]


@dataclass(frozen=True)
class PlacementReport:
    """The profile, the rates, the declared placement and the planned one (and pool sizes, given a step time)."""

    steps: int
    loads: list[TaskLoad]
    rates: list[PoolRates]
    declared: Placement
    chosen: Placement
    sizes: dict[str, int] | None = None

    def lines(self) -> list[str]:
        """The report as `rollart plan` prints it."""
        out = [f"profile: {self.steps} step(s); per step and per trajectory:"]
        out.append(f"  {'task':<20} {'traj/step':>9} {'prompt':>9} {'uncached':>9} {'decode':>8}")
        for t in self.loads:
            out.append(
                f"  {t.task:<20} {t.trajectories:>9.1f} {t.prompt_tokens:>9.0f} {t.uncached_prompt_tokens:>9.0f} "
                f"{t.decode_tokens:>8.0f}"
            )
        out.append("engine rates (tokens/s per engine):")
        for r in self.rates:
            out.append(
                f"  {r.pool:<8} {r.engines} engine(s)  prefill {r.prefill_tokens_per_s:>12,.0f}  "
                f"decode {r.decode_tokens_per_s:>10,.0f}"
            )
        out.append("plan:")
        out += [f"  {line}" for line in reasons(self.chosen, self.loads, self.declared)]
        moved = {t: p for t, p in self.chosen.assignment.items() if self.declared.assignment.get(t) != p}
        out.append(
            "  in the job spec: " + (", ".join(f"{t}: generate_pool: {p}" for t, p in moved.items()) or "as declared")
        )
        if self.sizes is not None:
            sizes = ", ".join(f"{p}: {n}" for p, n in self.sizes.items())
            out.append(f"engines per pool for the step time asked: {sizes}")
        return out


def profile(run_dir: Path, last: int | None = None) -> tuple[int, list[TaskLoad]]:
    """Each task's trajectories per step and tokens per trajectory over the run's (last `last`) steps."""
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("task_tokens")]
    if not rows:
        raise FileNotFoundError(
            f"{run_dir / 'metrics.jsonl'} has no step with task_tokens: is this a run dir of `rollart train` "
            "(0.1.0 or later)?"
        )
    rows = rows[-last:] if last else rows
    totals: dict[str, dict[str, float]] = {}
    for row in rows:
        for task, t in row["task_tokens"].items():
            acc = totals.setdefault(task, dict.fromkeys(("trajectories", "prompt", "uncached_prompt", "completion"), 0))
            for k in acc:
                acc[k] += t.get(k, 0)
    loads = [
        TaskLoad(
            task=task,
            trajectories=t["trajectories"] / len(rows),
            uncached_prompt_tokens=t["uncached_prompt"] / max(1, t["trajectories"]),
            decode_tokens=t["completion"] / max(1, t["trajectories"]),
            prompt_tokens=t["prompt"] / max(1, t["trajectories"]),
        )
        for task, t in sorted(totals.items())
    ]
    return len(rows), loads


def job_rates(
    job: JobSpec,
    params: float,
    engines: Mapping[str, int] | None = None,
    measured: Mapping[str, tuple[float, float]] | None = None,
) -> list[PoolRates]:
    """Each generation pool's rates: `measured` (prefill, decode tokens/s per engine) where given, else the roofline
    of its declared GPU for a `params` model; `engines` per pool (default: the job's kubernetes replicas, else 1)."""
    out = []
    for name, spec in job.pools.items():
        if spec.role != "generation":
            continue
        count = (engines or {}).get(name) or _replicas(job, name)
        if measured and name in measured:
            prefill, decode = measured[name]
        elif spec.gpu is None:
            raise ValueError(f"pool {name!r} declares no GPU, so it has no roofline: give its rates (--rates)")
        else:
            gpus = spec.gpu.count or job.engine.tensor_parallel_size
            r = engine_rates(spec.gpu.product, params, gpus=gpus)
            prefill, decode = r.prefill_tokens_per_s, r.decode_tokens_per_s
        out.append(PoolRates(name, count, prefill, decode))
    return out


def _replicas(job: JobSpec, pool: str) -> int:
    deployment = job.kubernetes.pools.get(pool) if job.kubernetes else None
    return deployment.replicas if deployment is not None and deployment.replicas else 1


def _last_placement(run_dir: Path) -> dict[str, str]:
    """Where the run's training workflow last placed its `generate_pool: auto` tasks (its last step record)."""
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("placement")]
    return dict(rows[-1]["placement"]) if rows else {}


def plan_from_run(
    job: JobSpec, run_dir: Path, rates: list[PoolRates], step_s: float | None = None, last: int | None = None
) -> PlacementReport:
    """The declared placement of the job's tasks (an auto task's: where the run last placed it) against the planned
    one, on the run's profile."""
    steps, loads = profile(run_dir, last)
    declared_pools = {t.name: t.generate_pool for t in job.tasks}
    placed = _last_placement(run_dir)  # an auto task: where the run last placed it, else the first placement pool
    for task, pool in declared_pools.items():
        if pool == AUTO_POOL:
            declared_pools[task] = placed.get(task) or job.placement_pools()[0]
    loads = [t for t in loads if t.task in declared_pools]
    if not loads:
        raise ValueError(f"the run's tasks are not the job's ({', '.join(declared_pools)})")
    declared = evaluate({t.task: declared_pools[t.task] for t in loads}, loads, rates)
    chosen = plan(loads, rates)
    sizes = None
    if step_s is not None:
        sizes = size_pools(loads, rates, chosen.assignment, step_s)
    return PlacementReport(steps, loads, rates, declared, chosen, sizes)
