"""Single turn: seconds and activities per training step of `examples/arithmetic.yaml` on a local stack.

The example job as it is (16 groups of 16 per batch, async bound 1, vLLM on `h20`), only shorter: one stack,
a 2-step warm-up, then `--repeats` jobs of `--steps` steps. Per step: the steady-state time between step
records (the first step, which waits for the first wave, left out), and every activity of the job's
workflows (from their histories) by type, divided by the steps. Before/after a change of the rollout's
command sequence: run it on each version in turn (docs/benchmarks.md, "single_turn").
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from temporalio.client import Client

from bench.report import RESULTS, format_table, write_results
from bench.rollout import cpu_seconds
from bench.training_run import job_timeline, stack_for
from rollart.client.train import start_training
from rollart.contracts.training import TrainingStatus
from rollart.infra.temporal.connection import connect
from rollart.infra.temporal.history import activity_spans
from rollart.infra.temporal.search_attributes import JOB_ID
from rollart.spec.config import JobSpec, StoreConfig, load_job
from rollart.workers.local_stack import LocalStack, pools_for_job

__all__ = ["main", "measure"]

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "arithmetic.yaml"
HOME = RESULTS / ".stack-single_turn"
KINDS = ("prompts", "generate", "generate_batch", "check", "reward_batch", "train_step", "describe_queues")


def arithmetic_job(steps: int) -> JobSpec:
    """The example, `steps` long, its model and store under the bench's home."""
    job = load_job(EXAMPLE)
    training = job.training.model_copy(update={"steps": steps})
    return job.model_copy(
        update={"training": training, "model_dir": HOME / "model", "store": StoreConfig(path=HOME / "store")}
    )


async def measure(client: Client, job: JobSpec, label: str, stack: LocalStack | None = None) -> dict[str, Any]:
    """One job to its end: wall, steady-state seconds per step, activities per step (all, and by type), the
    median wave (first call scheduled → last completed) and its generation, CPU seconds per step by process."""
    job_id = f"bench-st-{label}-{uuid.uuid4().hex[:6]}"
    cpu0 = cpu_seconds(stack) if stack is not None else {}
    t0 = time.monotonic()
    handle = await start_training(client, job, job_id, HOME / "runs" / job_id)
    result = await handle.result()
    wall = time.monotonic() - t0
    cpu1 = cpu_seconds(stack) if stack is not None else {}
    status = await handle.query("status", result_type=TrainingStatus)
    times = [r.time for r in status.history]
    per_step = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else wall / max(result.steps, 1)
    timeline = await job_timeline(client, job_id)
    kinds = Counter(r["activity"] for r in timeline)
    waves = await _waves(client, job_id)
    out: dict[str, Any] = {
        "wall_s": wall,
        "steps": result.steps,
        "s_per_step": per_step,
        "activities_per_step": sum(kinds.values()) / result.steps,
        "trained": result.trained,
        "failed": result.failed,
    }
    out.update({f"{k}_per_step": kinds.get(k, 0) / result.steps for k in KINDS})
    for k in ("generate", "generate_batch", "train_step"):  # how long one call runs (median), where it ran
        spans = [r["end"] - r["start"] for r in timeline if r["activity"] == k]
        if spans:
            out[f"{k}_s"] = statistics.median(spans)
    if waves:
        out["wave_s"] = statistics.median(w for w, _ in waves)
        out["wave_generation_s"] = statistics.median(g for _, g in waves)
    if stack is not None:
        used = {k: v - cpu0.get(k, 0.0) for k, v in cpu1.items()}
        for group in ("control", "temporal-server", "cpu", "h20", "serverless", "trainer"):
            out[f"cpu_s_{group}"] = sum(v for k, v in used.items() if k.split("#")[0] == group) / result.steps
    return out


async def _waves(client: Client, job_id: str) -> list[tuple[float, float]]:
    """Each finished wave (GroupRolloutWorkflow) of the job: its span, and its generation's (first generate
    started → last generate completed)."""
    query = f'WorkflowType="GroupRolloutWorkflow" AND {JOB_ID.name}="{job_id}" AND ExecutionStatus="Completed"'
    out = []
    async for wf in client.list_workflows(query):
        spans = activity_spans(await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history())
        gen = [a for a in spans if a.activity_type in ("generate", "generate_batch")]
        if gen and all(a.completed for a in spans):
            out.append(
                (
                    max(a.completed for a in spans) - min(a.scheduled for a in spans),
                    max(a.completed for a in gen) - min(a.started for a in gen),
                )
            )
    return out


async def _run(stack: LocalStack, steps: int, repeats: int) -> list[dict[str, Any]]:
    client = await connect(stack.temporal, stack.store)
    await measure(client, arithmetic_job(2), "warmup")  # the engine compiles, the trainer warms up
    runs = []
    for r in range(repeats):
        m = await measure(client, arithmetic_job(steps), f"r{r}", stack)
        runs.append(m)
        print(
            f"  repeat {r + 1}/{repeats}: {m['s_per_step']:.3f} s/step, {m['activities_per_step']:.1f} activities/step",
            flush=True,
        )
    return runs


COLUMNS = [
    ("label", "code", ""),
    ("s_per_step", "s/step", ".3f"),
    ("activities_per_step", "activities/step", ".1f"),
    *[(f"{k}_per_step", k, ".2f") for k in KINDS],
    ("generate_s", "generate s", ".3f"),
    ("generate_batch_s", "generate_batch s", ".3f"),
    ("train_step_s", "train_step s", ".3f"),
    ("wave_s", "wave s", ".3f"),
    ("wave_generation_s", "wave gen s", ".3f"),
    ("wall_s", "wall s", ".1f"),
]
CPU = [
    ("label", "code", ""),
    *[
        (f"cpu_s_{g}", f"{g} cpu s/step", ".3f")
        for g in ("control", "temporal-server", "cpu", "h20", "serverless", "trainer")
    ],
]


def main(argv: list[str]) -> int:
    """Run the measurement, print a table of medians, write bench/results/single_turn-LABEL.json."""
    parser = argparse.ArgumentParser(
        prog="python -m bench single_turn", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="10 steps x 1 repeat")
    parser.add_argument("--steps", type=int, default=30, help="training steps per job (default 30)")
    parser.add_argument("--repeats", type=int, default=3, help="jobs, one after another on one stack (default 3)")
    parser.add_argument("--label", default="current", help="names the code measured in the table and the file")
    args = parser.parse_args(argv)
    steps, repeats = (10, 1) if args.quick else (args.steps, args.repeats)
    job = arithmetic_job(steps)
    stack = stack_for(job, HOME, pools_for_job(job, training=True))
    print(f"single_turn: examples/arithmetic.yaml, {steps} steps x {repeats}; starting the stack ...", flush=True)
    with stack:
        runs = asyncio.run(_run(stack, steps, repeats))
    row: dict[str, Any] = {
        "label": args.label,
        "repeats": len(runs),
        "s_per_step_runs": [r["s_per_step"] for r in runs],
    }
    for key in runs[0]:
        row[key] = statistics.median(r[key] for r in runs)
    print(format_table([row], COLUMNS))
    print(format_table([row], CPU))
    print(f"  written: {write_results(f'single_turn-{args.label}', [row], steps=steps, repeats=repeats)}")
    return 0
