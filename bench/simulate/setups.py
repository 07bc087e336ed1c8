"""The simulated setups: this machine's end_to_end job (to calibrate against) and a paper-like 3,000-GPU cluster.

`calibration`: bench/end_to_end.py's job (bench/workload.py: FrozenLake as groups on h800 + single-turn
arithmetic on h20 [+ Sokoban on h800], batch 64) on one CPU vLLM engine per pool serving the 0.56M-param model.
Its constants are not fitted to end_to_end's walls: they come from other measurements on this machine —
bench/results/overhead.json (Temporal's wait + return per activity, 34 ms, and its CPU: the server's and the
control worker's cores per activity), end_to_end.json's sync row (the median generate call, 93 ms, less that
overhead, is the engine's iteration; the trainer's busy share is its step), and the activity counts, which say
how many turns the tiny model's episodes last (about 2 for FrozenLake's groups, 1 for Sokoban's).

`paper`: a 32B model; 1,024 H800s training, 1,024 H800s (TP 2) and 960 H20s (TP 2) generating; a FrozenLake-
like 8-turn task and a Sokoban-like 10-turn long-tail task on h800, a single-turn reasoning task (long
answers: decode-heavy) on h20; batch 5,120 trajectories, so bound 1 keeps ~10,000 in flight.
"""

from __future__ import annotations

from pathlib import Path

from bench.workload import LATENCY, SOKOBAN_LATENCY, arithmetic_task, frozenlake_task, multitask_job, sokoban_task
from rollart.contracts.training import TrainingPlan
from rollart.simulator.cluster import PoolSpec
from rollart.simulator.models import Lognormal, Overheads, TaskProfile, TrainerModel
from rollart.simulator.roofline import GPUS, MODELS, GpuSpec, ModelSpec
from rollart.simulator.run import Setup
from rollart.spec.config import AUTO_POOL, EngineConfig, JobSpec, PlacementConfig, StoreConfig, TrainingConfig

__all__ = ["MODES", "calibration", "paper"]

MODES: dict[str, tuple[str, int]] = {
    "batch b0 (sync)": ("batch", 0),
    "batch b1": ("batch", 1),
    "traj b1": ("trajectory", 1),
    "traj b2": ("trajectory", 2),
}
"""bench/end_to_end.py's modes: (rollout_mode, async_bound)."""

HOME = Path("/nonexistent/bench-simulate")  # the job specs need paths; nothing is read or written there

# ---------------------------------------------------------------- calibration (this machine)

TINY = ModelSpec("0.56M", params=0.56e6, kv_bytes_per_token=2 * 4 * 2 * 32 * 2)
"""bench's tiny model: 0.56M params (a few layers, hidden 64)."""

CPU = GpuSpec("cpu", flops=50e9, hbm_bw=10e9, hbm_bytes=4e9)
"""A share of this machine's 2 cores as vLLM's CPU backend uses them: the tiny model's compute is negligible,
its iteration cost is the engine's fixed `overhead_s`."""

ACTIVITY_S = 0.034
"""overhead.json, `temporal, groups, latency model`: wait 7 ms + return 25 ms ≈ 34 ms per activity (overhead_ms)."""

ACTIVITY_CPU_S = 0.027
"""end_to_end.json sync row: the server's 0.30 and the control worker's 0.11 cores over 46.2 s, per activity (690)."""

ORCHESTRATION_CORES = 1
"""Of this machine's 2 cores, what the server and the control worker get: the engines, env workers and trainer
use about one (end_to_end.json's cores columns in the async modes)."""

REQUEST_S = 0.0043
"""end_to_end.json sync row: the h800 worker's 0.12 cores over 46.2 s, per FrozenLake generation (~1,280)."""

ENGINE_ITERATION_S = 0.025
"""end_to_end.json sync row: the median generate call (93 ms, a group's 8 prompts) less ACTIVITY_S and 8 x
REQUEST_S: one iteration (max_tokens 1)."""

TRAIN_STEP_S = 0.092
"""end_to_end.json sync row: the trainer pool busy 4 % of 46.2 s over 20 steps."""

CHILD_S = 0.034
"""A child workflow's start: one more round trip through the server (taken as an activity's)."""


def calibration(
    mode: str, bound: int, *, steps: int = 20, sokoban: bool = False, seed: int = 0, cores: int = ORCHESTRATION_CORES
) -> Setup:
    """end_to_end's job in `mode`/`bound` on this machine's scale (one CPU engine per pool)."""
    job = multitask_job(HOME, steps, rollout_mode=mode, async_bound=bound, batch_size=64, sokoban=sokoban)
    profiles = {
        "frozenlake": TaskProfile(
            "frozenlake", Lognormal.of(LATENCY, "reset"), Lognormal.of(LATENCY, "step"), done_p=0.85, prompt_tokens=64
        ),
        "arithmetic": TaskProfile("arithmetic", done_p=1.0, prompt_tokens=32),
        "gem": TaskProfile(
            "gem", Lognormal.of(SOKOBAN_LATENCY, "reset"), Lognormal.of(SOKOBAN_LATENCY, "step"), done_p=0.95
        ),
    }
    pools = [
        PoolSpec(p, CPU, 1, overhead_s=ENGINE_ITERATION_S, kv_capacity=100_000, request_s=REQUEST_S)
        for p in ("h800", "h20")
    ]
    return Setup(
        name=f"{mode} b{bound}",
        plan=TrainingPlan.of(job),
        pools=pools,
        model=TINY,
        profiles=profiles,
        trainer=TrainerModel(fixed_s=TRAIN_STEP_S + ACTIVITY_S),
        overheads=Overheads(activity_s=ACTIVITY_S, child_s=CHILD_S, activity_cpu_s=ACTIVITY_CPU_S, cores=cores),
        seed=seed,
    )


# ---------------------------------------------------------------- paper-like (3,000 GPUs)

PAPER_POOLS = [PoolSpec("h800", "h800", 1024, tp=2), PoolSpec("h20", "h20", 960, tp=2)]
PAPER_TRAINER_GPUS = 1024
PAPER_BATCH = 5120

PAPER_PROFILES = {
    "frozenlake": TaskProfile(
        "frozenlake",
        Lognormal.of(LATENCY, "reset"),
        Lognormal.of(LATENCY, "step"),
        reset_failure_p=0.01,
        step_failure_p=0.002,
        done_p=0.15,
        prompt_tokens=512,
        obs_tokens=64,
        output=Lognormal(128, 512),
        max_output=1024,
    ),
    "gem": TaskProfile(
        "gem",
        Lognormal.of(SOKOBAN_LATENCY, "reset"),
        Lognormal.of(SOKOBAN_LATENCY, "step"),
        reset_failure_p=0.02,
        step_failure_p=0.005,
        done_p=0.1,
        prompt_tokens=768,
        obs_tokens=128,
        output=Lognormal(256, 1024),
        max_output=2048,
    ),
    "arithmetic": TaskProfile(
        "arithmetic", done_p=1.0, prompt_tokens=256, output=Lognormal(1024, 4096), max_output=8192
    ),
}


def paper(
    mode: str,
    bound: int,
    *,
    horizon_s: float = 3600.0,
    scale: float = 1.0,
    swap_pools: bool = False,
    priority: str = "fifo",
    unit: str = "trajectory",
    seed: int = 0,
    max_num_seqs: int = 256,
    gen_share: float = 1.0,
    auto_every: int | None = None,
    start_placement: dict[str, str] | None = None,
) -> Setup:
    """The paper-like cluster for `horizon_s` simulated seconds; `scale` shrinks GPUs and the batch alike (tests,
    quick runs); `swap_pools` puts the multi-turn tasks on h20 and the single-turn one on h800 (the alternative
    to the manual affinity); `priority` is the engines' queue order (`fifo` or `turns`), which matters only where
    requests wait: `max_num_seqs` below the load makes them. `gen_share` scales the generation pools alone (the
    same batch on fewer engines: a more loaded cluster). `unit`: the multi-turn tasks' `trajectory`, `group`
    (lockstep) or `free` (a group whose members play free of lockstep). `auto_every`: every task
    `generate_pool: auto`, re-planned every that many steps (`training.placement`, the 32B model's rooflines as
    priors); `start_placement` replaces their first spread (a deliberately bad start)."""
    multi, single = ("h20", "h800") if swap_pools else ("h800", "h20")
    rollout_unit, group_play = ("group", "free") if unit == "free" else (unit, "lockstep")
    fl = frozenlake_task(pool=multi, rollout_unit=rollout_unit, group_play=group_play)
    sok = sokoban_task(pool=multi, rollout_unit=rollout_unit, group_play=group_play)
    arith = arithmetic_task(pool=single)
    tasks = [
        fl.model_copy(update={"weight": 0.4, "sampling": fl.sampling.model_copy(update={"max_tokens": 1024})}),
        sok.model_copy(update={"weight": 0.2, "sampling": sok.sampling.model_copy(update={"max_tokens": 2048})}),
        arith.model_copy(update={"weight": 0.4, "sampling": arith.sampling.model_copy(update={"max_tokens": 8192})}),
    ]
    pools = [
        PoolSpec(
            p.name, p.gpu, max(p.tp, int(p.gpus * scale * gen_share) // p.tp * p.tp), tp=p.tp, max_num_seqs=max_num_seqs
        )
        for p in PAPER_POOLS
    ]
    placement = PlacementConfig()
    if auto_every is not None:
        tasks = [t.model_copy(update={"generate_pool": AUTO_POOL}) for t in tasks]
        placement = PlacementConfig(
            every_steps=auto_every,
            pools=[p.name for p in PAPER_POOLS],
            model_params=MODELS["32b"].params,
            engines={p.name: p.engines for p in pools},  # as a job's kubernetes replicas would say
        )
    batch = max(8, int(PAPER_BATCH * scale) // 8 * 8)
    job = JobSpec(
        name="simulate",
        model_dir=HOME / "model",
        tasks=tasks,
        training=TrainingConfig(
            steps=100_000,
            batch_size=batch,
            async_bound=bound,
            rollout_mode=mode,
            continue_as_new_every=1000,
            placement=placement,
        ),
        engine=EngineConfig(max_model_len=32768, priority=priority),
        store=StoreConfig(path=HOME / "store"),
        # a cluster sized for the job: children and the control workers' sticky caches are not the limit here
        temporal={"max_pending_children": 1_000_000, "workers": {"max_cached_workflows": 1_000_000}},
    )
    model = MODELS["32b"]
    trainer_gpus = max(8, int(PAPER_TRAINER_GPUS * scale))
    return Setup(
        name=f"{mode} b{bound}"
        + (" swapped" if swap_pools else "")
        + f" {priority} {max_num_seqs} seqs"
        + (f" gen x{gen_share:g}" if gen_share != 1.0 else "")
        + (f" auto/{auto_every}" if auto_every is not None else ""),
        plan=TrainingPlan.of(job),
        pools=pools,
        model=model,
        profiles=PAPER_PROFILES,
        trainer=TrainerModel.of(model, GPUS["h800"], trainer_gpus, mfu=0.4, fixed_s=10.0),
        overheads=Overheads(activity_s=0.02, child_s=0.05),
        horizon_s=horizon_s,
        seed=seed,
        start_placement=start_placement,
    )
