"""The `rollart` command line: init-model, worker, up, rollout, train, status, plot, k8s. Every command has --help."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # heavy modules load lazily: `rollart --help` stays instant
    import threading

    from rollart.infra.config import JobSpec
    from rollart.workers.pool_worker import WorkerSettings
    from rollart.client.rollout import RolloutOutcome
    from temporalio.client import Client

from rollart.infra.devserver import DevServerError
from rollart.workers.local_stack import StackError

__all__ = ["main"]

log = logging.getLogger("rollart")

EXIT_BAD_INPUT = 2


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script; exits via os._exit to dodge a known SDK crash at interpreter exit."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname).1s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    for noisy in ("temporalio", "vllm", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # SIGTERM (a scheduler, `kill`) stops as Ctrl-C does: the local stack is torn down, never orphaned.
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # started in the background by a shell
        signal.signal(signal.SIGINT, _raise_keyboard_interrupt)
    try:
        rc = args.func(args)
    except KeyboardInterrupt:
        rc = 130
    except (DevServerError, StackError) as e:
        print(f"error: {e}", file=sys.stderr)
        rc = 1
    except _UserError as e:
        print(f"error: {e}", file=sys.stderr)
        rc = EXIT_BAD_INPUT
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


class _UserError(Exception):
    """Something the user can fix; printed without a traceback."""


def _parser() -> argparse.ArgumentParser:
    from rollart.infra.pools import Pool

    p = argparse.ArgumentParser(
        prog="rollart",
        description="Agentic RL on disaggregated hardware pools, orchestrated by Temporal.",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("init-model", help="build the tiny random-init Qwen2 model and tokenizer (offline)")
    s.add_argument("--out", type=Path, required=True, help="directory to write the model to")
    s.add_argument("--seed", type=int, default=0, help="init seed (same seed, same weights)")
    s.add_argument("--force", action="store_true", help="rebuild even if DIR already holds a model")
    s.set_defaults(func=_cmd_init_model)

    s = sub.add_parser("worker", help="run one Temporal worker for one pool (one per pool per machine)")
    s.add_argument("--pool", choices=[p.value for p in Pool], help="the pool to serve")
    s.add_argument("--job", type=Path, help="job spec to take the model, engine, store and Temporal settings from")
    _add_temporal_args(s)
    s.add_argument("--model-dir", type=Path, help="model for generation pools (default: the job's, or the tiny model)")
    s.add_argument("--engine", choices=["vllm", "hf"], help="inference engine for generation pools (default vllm)")
    s.add_argument("--store-path", type=Path, help="payload store directory (must be shared with every worker)")
    s.add_argument("--store-master", metavar="HOST:PORT",
                   help="Mooncake master to use (sets store.kind: mooncake; its keeper holds the data)")
    t = s.add_argument_group("trainer nodes", "a multi-node trainer: one `rollart worker --pool trainer` per node "
                             "(torchrun-style); each starts its share of the job's trainer.parallel ranks")
    t.add_argument("--nnodes", type=int, default=1, help="trainer nodes in all (default 1)")
    t.add_argument("--node-rank", type=int, default=0, help="this node's index, 0..NNODES-1; node 0 polls Temporal")
    t.add_argument("--rdzv", metavar="HOST:PORT", help="node 0's rendezvous address, reachable from every node "
                   "(node 0 listens there)")
    s.add_argument("--settings-file", type=Path, help=argparse.SUPPRESS)
    s.set_defaults(func=_cmd_worker)

    s = sub.add_parser("autoscale", help="scale an elastic pool's local worker processes with its queue's backlog",
                       description="Read the pool's activity backlog from Temporal every few seconds and start or "
                       "stop local `rollart worker` processes between --min and --max (SIGTERM: they drain first). "
                       "Decisions are logged. Defaults come from the job's pools.<pool> section.")
    s.add_argument("--pool", default="serverless", help="the elastic pool to scale (default serverless)")
    s.add_argument("--job", type=Path, help="job spec to take the store, Temporal and scaling settings from")
    _add_temporal_args(s)
    s.add_argument("--min", type=int, dest="min_workers", help="fewest workers, may be 0 (default: the job's, else 1)")
    s.add_argument("--max", type=int, dest="max_workers", help="most workers (default: the job's, else 4)")
    s.add_argument("--concurrency", type=int, dest="max_concurrent_activities",
                   help="activities one worker runs at once (default 16)")
    s.add_argument("--backlog-per-worker", type=int, help="backlog that asks for one more worker (default: --concurrency)")
    s.add_argument("--scale-up-cooldown", type=float, dest="scale_up_cooldown_s", help="seconds between scale-ups (default 6)")
    s.add_argument("--scale-down-cooldown", type=float, dest="scale_down_cooldown_s",
                   help="seconds the queue must want fewer workers before they stop (default 30)")
    s.add_argument("--poll-interval", type=float, dest="poll_interval_s", help="seconds between backlog reads (default 2)")
    s.add_argument("--store-path", type=Path, help="payload store directory (must be shared with every worker)")
    s.add_argument("--home", type=Path, help="where worker settings and logs go (default .rollart)")
    s.set_defaults(func=_cmd_autoscale)

    s = sub.add_parser("up", help="start the local Temporal dev server and one worker per pool; Ctrl-C stops all")
    s.add_argument("--job", type=Path, help="job spec for the workers' settings (default: examples/frozenlake.yaml's defaults)")
    s.add_argument("--pools", help="comma-separated pools to start (default: control,cpu,h800,h20,serverless,trainer)")
    _add_stack_args(s)
    s.set_defaults(func=_cmd_up)

    s = sub.add_parser("rollout", help="run N trajectories of a job and print their outcomes")
    s.add_argument("job", type=Path, help="job spec (YAML or JSON)")
    s.add_argument("-n", "--num", type=int, default=16, help="number of trajectories (default 16)")
    s.add_argument("--seed", type=int, default=0, help="seed for task draws and env seeds")
    _add_temporal_args(s)
    s.add_argument("--ui-url", help="Temporal UI base URL for links (default: http://HOST:8233)")
    _add_stack_args(s)
    s.set_defaults(func=_cmd_rollout)

    s = sub.add_parser("train", help="train a policy: rollout and training overlapped under the async bound")
    s.add_argument("job", type=Path, help="job spec (YAML or JSON)")
    s.add_argument("--steps", type=int, help="train steps (default: the job's training.steps)")
    s.add_argument("--async-bound", type=int, help="max policy versions a trajectory may lag (0 = on-policy)")
    s.add_argument("--rollout-mode", choices=["trajectory", "batch"], help="trajectory (RollArt) or batch (lockstep)")
    s.add_argument("--run-dir", type=Path, help="where metrics.jsonl, checkpoints and plots go (default runs/JOB_ID)")
    _add_temporal_args(s)
    s.add_argument("--ui-url", help="Temporal UI base URL for links (default: http://HOST:8233)")
    _add_stack_args(s)
    s.set_defaults(func=_cmd_train)

    s = sub.add_parser("plot", help="write learning-curve and rollout-timeline PNGs for a run dir, or compare runs")
    s.add_argument("run_dirs", type=Path, nargs="+", metavar="RUN_DIR",
                   help="a `rollart train` run dir (holds metrics.jsonl); several: one comparison plot")
    s.add_argument("--out", type=Path, help="comparison PNG (default: compare.png in the first run dir)")
    s.add_argument("--labels", help="comma-separated legend labels for the compared runs (default: dir names)")
    s.add_argument("--smooth", type=int, default=5, help="moving-average window in steps for compared curves")
    s.set_defaults(func=_cmd_plot)

    s = sub.add_parser("eval", help="a policy version's greedy success rate on held-out seeds (no Temporal needed)")
    s.add_argument("job", type=Path, help="job spec (YAML or JSON): its tasks, model dir and store")
    s.add_argument("--job-id", help="the training job whose published weights to load (default: the untrained model)")
    s.add_argument("--version", type=int, help="policy version to load (default: the job's latest)")
    s.add_argument("--task", action="append", help="task name(s) to evaluate (default: every task)")
    s.add_argument("-n", "--episodes", type=int, default=200, help="held-out episodes per task (default 200)")
    s.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); the task's own to compare")
    s.set_defaults(func=_cmd_eval)

    s = sub.add_parser("status", help="print a training job's live status (step, ledger, last rewards)")
    s.add_argument("job_id", help="the job id `rollart train` printed (= the TrainingWorkflow's id)")
    s.add_argument("--temporal-address", metavar="HOST:PORT", default="127.0.0.1:7233", help="Temporal server")
    s.add_argument("--namespace", default="default", help="Temporal namespace")
    s.set_defaults(func=_cmd_status)

    k8s = sub.add_parser("k8s", help="render or apply Kubernetes manifests for a job (a Deployment per pool, "
                         "a StatefulSet of trainer nodes)")
    k8s_sub = k8s.add_subparsers(dest="k8s_command", required=True, metavar="K8S_COMMAND")
    s = k8s_sub.add_parser("render", help="write the job's manifests to a directory, one YAML file per object")
    s.add_argument("job", type=Path, help="job spec (YAML or JSON); its `kubernetes` section is optional")
    s.add_argument("-o", "--out", type=Path, required=True, help="directory to write the manifests to")
    _add_k8s_args(s)
    s.set_defaults(func=_cmd_k8s_render)
    s = k8s_sub.add_parser("apply", help="server-side dry-run every object, then apply them (current kubeconfig)")
    s.add_argument("job", type=Path, help="job spec (YAML or JSON); its `kubernetes` section is optional")
    s.add_argument("--dry-run", action="store_true", help="only the server-side dry-run; change nothing")
    s.add_argument("--context", help="kubeconfig context (default: the current one)")
    _add_k8s_args(s)
    s.set_defaults(func=_cmd_k8s_apply)
    return p


def _add_k8s_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("--image", help="the CPU image, for pools without GPUs (overrides kubernetes.image)")
    s.add_argument("--gpu-image", help="the GPU image, for generation pools and trainer ranks on GPUs "
                   "(overrides kubernetes.gpu_image)")
    s.add_argument("--temporal-address", metavar="HOST:PORT",
                   help="Temporal frontend as the pods see it (overrides kubernetes.temporal_address)")
    s.add_argument("--hpa", action="store_true", help="scale serverless with a CPU HPA instead of KEDA")


def _add_temporal_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("--temporal-address", metavar="HOST:PORT", help="an existing Temporal server (default: local)")
    s.add_argument("--namespace", help="Temporal namespace (default: the job's, else 'default')")


def _add_stack_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("--home", type=Path, help="where the local stack keeps its database, logs and store (default .rollart)")
    s.add_argument("--port", type=int, default=7233, help="local Temporal gRPC port (default 7233)")
    s.add_argument("--ui-port", type=int, default=8233, help="local Temporal UI port (default 8233)")


# ---------------------------------------------------------------- init-model


def _cmd_init_model(args: argparse.Namespace) -> int:
    from rollart.infra.tiny_model import build_tiny_model

    if (args.out / "config.json").exists() and not args.force:
        print(f"{args.out} already holds a model (use --force to rebuild)")
        return 0
    t0 = time.monotonic()
    path = build_tiny_model(args.out, seed=args.seed)
    print(f"built tiny model in {path} ({time.monotonic() - t0:.1f}s)")
    return 0


# ---------------------------------------------------------------- worker


def _cmd_worker(args: argparse.Namespace) -> int:
    from rollart.workers.pool_worker import WorkerSettings, run_worker

    if args.settings_file:
        settings = WorkerSettings.model_validate_json(args.settings_file.read_text())
    else:
        if not args.pool:
            raise _UserError("--pool is required (one of control, cpu, h800, h20, serverless)")
        job = _load_job(args.job, args) if args.job else None
        settings = _worker_settings(args, job)
    from rollart.activities.training.devices import DeviceUnavailable

    try:
        return run_worker(settings)
    except DeviceUnavailable as e:
        raise _UserError(f"the {settings.pool.value} worker cannot run on this machine: {e}") from e


def _worker_settings(args: argparse.Namespace, job: JobSpec | None) -> WorkerSettings:
    from rollart.infra.pools import Pool
    from rollart.workers.pool_worker import WorkerSettings

    pool = Pool(args.pool)
    base = WorkerSettings.from_job(job, pool) if job is not None else WorkerSettings(pool=pool)
    updates: dict[str, object] = {}
    if args.temporal_address or args.namespace:
        updates["temporal"] = base.temporal.model_copy(
            update={k: v for k, v in {"address": args.temporal_address, "namespace": args.namespace}.items() if v}
        )
    if args.model_dir:
        updates["model_dir"] = args.model_dir
    if args.engine:
        updates["engine"] = base.engine.model_copy(update={"kind": args.engine})
    store = base.store
    if args.store_path:
        store = store.model_copy(update={"path": args.store_path})
    if args.store_master:
        try:
            store = store.model_copy(update={"kind": "mooncake"}).with_master(args.store_master)
        except ValueError as e:
            raise _UserError(f"--store-master: expected HOST:PORT, got {args.store_master!r}") from e
    if store.kind == "mooncake" and not store.mooncake.master:
        raise _UserError("the job's store is Mooncake but no master is given: pass --store-master HOST:PORT "
                         "(the address `rollart up` prints, or your cluster's mooncake_master)")
    if store is not base.store:
        updates["store"] = store
    if args.nnodes != 1 or args.node_rank or args.rdzv:
        if pool is not Pool.TRAINER:
            raise _UserError("--nnodes/--node-rank/--rdzv are for --pool trainer only")
        from pydantic import ValidationError
        from rollart.workers.pool_worker import TrainerNodes

        try:
            updates["nodes"] = TrainerNodes(nnodes=args.nnodes, node_rank=args.node_rank, rdzv=args.rdzv)
        except ValidationError as e:
            raise _UserError("; ".join(err["msg"].removeprefix("Value error, ") for err in e.errors())) from e
        parallel = base.trainer.parallel
        if job is not None and parallel.world_size % args.nnodes:
            raise _UserError(f"{args.job}: trainer.parallel tensor {parallel.tensor} x data {parallel.data} = "
                             f"{parallel.world_size} ranks do not split over --nnodes {args.nnodes}")  # fmt: skip
    return base.model_copy(update=updates)


# ---------------------------------------------------------------- autoscale


_SCALING_FLAGS = ("min_workers", "max_workers", "max_concurrent_activities", "backlog_per_worker",
                  "scale_up_cooldown_s", "scale_down_cooldown_s", "poll_interval_s")  # fmt: skip


def _cmd_autoscale(args: argparse.Namespace) -> int:
    from pydantic import ValidationError
    from rollart.infra.config import ELASTIC_POOLS, ElasticPoolConfig, format_validation_error
    from rollart.infra.pools import Pool
    from rollart.workers.autoscaler import Autoscaler, WorkerProcesses

    elastic = ", ".join(p.value for p in ELASTIC_POOLS)
    if args.pool not in {p.value for p in Pool}:
        raise _UserError(f"--pool: unknown pool {args.pool!r}; pools are {', '.join(p.value for p in Pool)}")
    pool = Pool(args.pool)
    if pool not in ELASTIC_POOLS:
        raise _UserError(f"--pool: {pool.value!r} has a fixed set of workers (`rollart worker --pool {pool.value}`); "
                         f"only {elastic} autoscales")  # fmt: skip
    job = _load_job(args.job, args) if args.job else None
    base = job.elastic(pool) if job else ElasticPoolConfig()
    flags = {k: getattr(args, k) for k in _SCALING_FLAGS if getattr(args, k) is not None}
    try:
        cfg = ElasticPoolConfig.model_validate({**base.model_dump(), **flags})
    except ValidationError as e:
        raise _UserError(format_validation_error(e, "autoscale options").replace("invalid job spec", "invalid")) from e
    args.pool, args.model_dir, args.engine = pool.value, None, None
    settings = _worker_settings(args, job).model_copy(update={"max_concurrent_activities": cfg.max_concurrent_activities})
    scaler = Autoscaler(cfg=cfg, procs=WorkerProcesses(settings, _home(args)))

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await scaler.run(stop)

    print(f"autoscaling {pool.value} on {settings.temporal.address or '127.0.0.1:7233'}: {cfg.min_workers}..{cfg.max_workers} "
          f"workers; logs in {_home(args) / 'logs'}; Ctrl-C stops them", flush=True)  # fmt: skip
    try:
        asyncio.run(run())
    except ConnectionError as e:
        raise _UserError(str(e)) from e
    return 0


# ---------------------------------------------------------------- up


def _cmd_up(args: argparse.Namespace) -> int:
    from rollart.infra.pools import WORKER_POOLS, Pool
    from rollart.workers.local_stack import LocalStack

    job = _load_job(args.job, args) if args.job else _default_job()
    try:
        pools = [Pool(p.strip()) for p in args.pools.split(",")] if args.pools else list(WORKER_POOLS)
    except ValueError as e:
        raise _UserError(f"--pools: {e}") from e
    _prepare_local_stack(job)
    unserved = sorted({t.reward_queue for t in job.tasks} - {p.value for p in pools})
    if unserved:
        print(f"warning: the job's rewards run on {', '.join(unserved)}, which --pools does not start here; "
              "run those workers elsewhere (or `rollart autoscale`), or rewards will wait", file=sys.stderr)  # fmt: skip
    stack = LocalStack(job=job, pools=pools, home=_home(args), port=args.port, ui_port=args.ui_port)
    stop = _stop_on_signals()
    print(f"starting Temporal on {stack.address} and workers for: {', '.join(p.value for p in pools)} ...")
    with stack:
        print(f"ready. Temporal UI: {stack.ui_url}   server: {stack.address}   logs: {stack.home / 'logs'}")
        if stack.mooncake:
            master = stack.mooncake.address
            print(f"Mooncake master: {master} (workers on other machines: --store-master {master})")
        for name, pid in stack.worker_pids().items():
            print(f"  worker {name:<14} pid {pid}")
        print("Ctrl-C stops everything.")
        stop.wait()
        print("stopping workers (draining in-flight work) and the server ...")
    print("stopped.")
    return 0


def _stop_on_signals() -> threading.Event:
    import threading

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


# ---------------------------------------------------------------- rollout


def _cmd_rollout(args: argparse.Namespace) -> int:
    from rollart.workers.local_stack import LocalStack, pools_for_job
    from rollart.client.rollout import JobCheckError, check_job_components

    if args.num < 1:
        raise _UserError("-n must be at least 1")
    job = _load_job(args.job, args)
    try:
        check_job_components(job)
    except JobCheckError as e:
        raise _UserError(f"{args.job}: {e}") from e
    if job.temporal.address:
        ui = args.ui_url or f"http://{job.temporal.address.rsplit(':', 1)[0]}:8233"
        return asyncio.run(_rollout(job, args, ui))
    _prepare_local_stack(job)
    stack = LocalStack(job=job, pools=pools_for_job(job), home=_home(args), port=args.port, ui_port=args.ui_port)
    print(f"starting the local stack (Temporal on {stack.address}, workers: "
          f"{', '.join(p.value for p in stack.pools)}) ...")
    with stack:
        job = job.model_copy(update={"temporal": stack.temporal, "store": stack.store})
        rc = asyncio.run(_rollout(job, args, args.ui_url or stack.ui_url or ""))
        print(f"history kept in {stack.home / 'temporal.db'}; `rollart up` serves it again in the UI")
    return rc


async def _rollout(job: JobSpec, args: argparse.Namespace, ui: str) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rollart.client.rollout import new_job_id, plan_trajectories, run_rollout

    client = await _connect(job)
    job_id = new_job_id(job)
    inputs = plan_trajectories(job, args.num, args.seed, job_id)
    print(f"job {job_id}: starting {len(inputs)} trajectories on queue 'control'")
    t0 = time.monotonic()
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[stats]}")]  # fmt: skip
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task("trajectories", total=len(inputs), stats="")
        wins = [0, 0]

        def done(o: RolloutOutcome) -> None:
            wins[0] += bool(o.result and o.result.success)
            wins[1] += 1
            bar.update(task, advance=1, stats=f"success {wins[0]}/{wins[1]}")

        outcomes = await run_rollout(client, inputs, job_id, on_done=done)
    wall = time.monotonic() - t0
    _print_outcomes(job_id, outcomes, ui, job.temporal.namespace, wall)
    return 0 if all(o.status == "completed" for o in outcomes) else 1


async def _connect(job: JobSpec) -> Client:
    from rollart.infra.temporal import connect

    try:
        return await connect(job.temporal, job.store)
    except ConnectionError as e:
        raise _UserError(str(e)) from e


def _print_outcomes(job_id: str, outcomes: list[RolloutOutcome], ui: str, namespace: str, wall: float) -> None:
    from rich.console import Console
    from rich.table import Table
    from rollart.infra.temporal import ui_url

    table = Table(title=f"job {job_id}")
    for col in ("#", "task", "seed", "status", "reward", "success", "turns", "versions"):
        table.add_column(col, overflow="fold")
    table.add_column("Temporal UI", no_wrap=True)
    for i, o in enumerate(outcomes):
        r = o.result
        versions = f"{r.policy_version_min}..{r.policy_version_max}" if r and r.policy_version_min is not None else "-"
        status = o.status if o.status == "completed" else f"[red]{o.status}[/red]: {(r.error if r else o.error) or ''}"
        table.add_row(
            str(i), o.inp.task.name, str(o.inp.seed), status,
            f"{r.reward:.3f}" if r and r.reward is not None else "-",
            ("yes" if r.success else "no") if r and r.success is not None else "-",
            str(r.turns) if r else "-", versions,
            ui_url(ui, namespace, o.workflow_id) if ui else o.workflow_id,
        )  # fmt: skip
    console = Console(width=max(170, Console().width))
    console.print(table)
    done = [o.result for o in outcomes if o.result and o.status == "completed"]
    turns: dict[str, int] = {}  # per workflow: a group plays its longest member's turns, one call per turn for all
    for o in outcomes:
        if o.result and o.status == "completed":
            turns[o.workflow_id] = max(turns.get(o.workflow_id, 0), o.result.turns)
    activities = sum(2 * t + 3 for t in turns.values())  # reset, (generate + step) per turn, reward, close
    rewards = [r.reward for r in done if r.reward is not None]
    print(
        f"{len(done)}/{len(outcomes)} completed in {wall:.1f}s · {len(outcomes) / wall:.2f} trajectories/s · "
        f"{activities / wall:.1f} activities/s · success {sum(bool(r.success) for r in done)}/{len(done)} · "
        f"mean reward {statistics.fmean(rewards) if rewards else float('nan'):.3f}"
    )


# ---------------------------------------------------------------- train / status


def _cmd_train(args: argparse.Namespace) -> int:
    from rollart.workers.local_stack import LocalStack, pools_for_job
    from rollart.client.rollout import JobCheckError, check_job_components, new_job_id

    job = _load_job(args.job, args)
    training = {k: v for k, v in {"steps": args.steps, "async_bound": args.async_bound,
                                  "rollout_mode": args.rollout_mode}.items() if v is not None}  # fmt: skip
    if training:
        try:
            job = job.model_validate({**job.model_dump(), "training": {**job.training.model_dump(), **training}})
        except Exception as e:
            raise _UserError(f"bad training option: {e}") from e
    try:
        check_job_components(job)
    except JobCheckError as e:
        raise _UserError(f"{args.job}: {e}") from e
    job_id = new_job_id(job)
    run_dir = (args.run_dir or Path("runs") / job_id).resolve()
    if job.temporal.address:
        ui = args.ui_url or f"http://{job.temporal.address.rsplit(':', 1)[0]}:8233"
        return asyncio.run(_train(job, job_id, run_dir, ui, terminate_on_interrupt=False))
    _prepare_local_stack(job)
    stack = LocalStack(job=job, pools=pools_for_job(job, training=True), home=_home(args), port=args.port,
                       ui_port=args.ui_port)  # fmt: skip
    print(f"starting the local stack (Temporal on {stack.address}, workers: {', '.join(p.value for p in stack.pools)}) ...")
    with stack:
        job = job.model_copy(update={"temporal": stack.temporal, "store": stack.store})
        rc = asyncio.run(_train(job, job_id, run_dir, args.ui_url or stack.ui_url or "", terminate_on_interrupt=True))
        print(f"history kept in {stack.home / 'temporal.db'}; `rollart up` serves it again in the UI")
    return rc


async def _train(job: JobSpec, job_id: str, run_dir: Path, ui: str, terminate_on_interrupt: bool) -> int:
    """Start and follow a job. Interrupted: on the local stack the job is terminated (its workers are going
    away with the stack); on a shared server it keeps running and `rollart status` finds it again."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rollart.infra.temporal import ui_url
    from rollart.client.train import MetricsWriter, follow, start_training, terminate_job

    client = await _connect(job)
    t = job.training
    handle = await start_training(client, job, job_id, run_dir)
    print(f"job {job_id}: {t.steps} steps, batch {t.batch_size}, async bound {t.async_bound}, "
          f"{t.rollout_mode} rollout; run dir {run_dir}")  # fmt: skip
    if ui:
        print(f"Temporal UI: {ui_url(ui, job.temporal.namespace, job_id)}")
    writer = MetricsWriter(run_dir)
    columns = [TextColumn("step"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.fields[stats]}")]
    with Progress(*columns) as bar:
        task = bar.add_task("train", total=t.steps, stats="rolling out ...")

        def on_step(row: dict) -> None:
            tasks = " ".join(f"{k} {v:.2f}" for k, v in sorted(row["task_success"].items())) if len(row["task_success"]) > 1 else ""
            stats = (f"reward {row['reward_mean']:.3f} success {row['success_rate']:.2f} {tasks} "
                     f"stale {row['staleness_mean']:.1f}/{row['staleness_max']} "
                     f"{row['trajectories_per_s']:.1f} traj/s {row['tokens_per_s']:.0f} tok/s dropped {row['dropped']}")  # fmt: skip
            bar.update(task, completed=row["step"] + 1, stats=stats)
            if not bar.console.is_terminal:  # a log file gets one line per step instead of a bar
                print(f"step {row['step'] + 1}/{t.steps} {row['elapsed_s']:.0f}s {stats}", flush=True)

        interrupted = _cancel_on_signals()
        try:
            result = await follow(handle, writer, on_step)
        except asyncio.CancelledError:
            if not interrupted.is_set():
                raise
            if terminate_on_interrupt:
                n = await terminate_job(client, job_id, "rollart train was interrupted")
                print(f"interrupted: terminated the job's {n} running workflows", flush=True)
            else:
                print(f"interrupted: job {job_id} keeps running on {job.temporal.address}", flush=True)
            return 130
    from rollart.client.plot import plot_run
    from rollart.client.timeline import collect_timeline, write_timeline

    print("collecting the rollout timeline from the workflow histories ...")
    write_timeline(await collect_timeline(client, job_id), run_dir)
    plots = plot_run(run_dir)
    print(f"done: {result.steps} steps, policy v{result.version}; trajectories started {result.started} = trained "
          f"{result.trained} + dropped {result.dropped} + failed {result.failed} + cancelled in flight "
          f"{result.cancelled_in_flight} + buffered {result.buffered_unused}")  # fmt: skip
    if result.last:
        print(f"last step: reward {result.last.reward_mean:.3f}, success {result.last.success_rate:.2f}")
    print(f"metrics: {writer.path}   plots: {', '.join(str(p) for p in plots)}")
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    from rollart.client.plot import compare_runs, plot_run

    labels = args.labels.split(",") if args.labels else [d.name for d in args.run_dirs]
    if len(labels) != len(args.run_dirs):
        raise _UserError(f"--labels has {len(labels)} labels for {len(args.run_dirs)} run dirs")
    try:
        if len(args.run_dirs) == 1:
            paths = plot_run(args.run_dirs[0])
        else:
            out = args.out or args.run_dirs[0] / "compare.png"
            paths = [compare_runs(args.run_dirs, labels, out, smooth=args.smooth)]
    except FileNotFoundError as e:
        raise _UserError(str(e)) from e
    for path in paths:
        print(f"wrote {path}")
    return 0


def _cancel_on_signals() -> asyncio.Event:
    """SIGINT/SIGTERM cancel the running task at its current await (never mid-statement); the event says so."""
    interrupted = asyncio.Event()
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()

    def cancel() -> None:
        interrupted.set()
        if task is not None:
            task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, cancel)
    return interrupted


def _cmd_eval(args: argparse.Namespace) -> int:
    from rollart.infra.tiny_model import ensure_tiny_model
    from rollart.client.evaluate import evaluate

    job = _load_job(args.job, argparse.Namespace())
    if args.episodes < 1:
        raise _UserError(f"--episodes must be at least 1, got {args.episodes}")
    try:
        tasks = [job.task(name) for name in args.task] if args.task else job.tasks
    except KeyError as e:
        raise _UserError(str(e.args[0])) from e
    ensure_tiny_model(job.model_dir)
    print(f"{'task':<16} {'version':>7} {'episodes':>8} {'success':>8} {'reward':>8}  (temperature {args.temperature:g})")
    for task in tasks:
        try:
            r = asyncio.run(evaluate(job, task, args.job_id, args.version, args.episodes, args.temperature))
        except ValueError as e:
            raise _UserError(str(e)) from e
        print(f"{r.task:<16} {r.version:>7} {r.episodes:>8} {r.success_rate:>8.3f} {r.reward_mean:>8.3f}")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    return asyncio.run(_status(args))


async def _status(args: argparse.Namespace) -> int:
    from rollart.infra.config import StoreConfig, TemporalConfig
    from rollart.infra.temporal import connect
    from rollart.client.train import status_of
    from temporalio.service import RPCError

    try:
        client = await connect(TemporalConfig(address=args.temporal_address, namespace=args.namespace), StoreConfig())
        st = await status_of(client.get_workflow_handle(args.job_id))
    except (ConnectionError, RPCError) as e:
        raise _UserError(f"cannot get the status of {args.job_id!r} from {args.temporal_address}: {e}") from e
    state = "done" if st.done else "stopping" if st.stopping else "paused" if st.paused else "running"
    print(f"job {st.job_id}: {state}, step {st.step}/{st.steps} (policy v{st.version}), "
          f"{st.rollout_mode} rollout, async bound {st.async_bound}")  # fmt: skip
    print(f"trajectories: started {st.started} = trained {st.trained} + dropped {st.dropped} + failed {st.failed} "
          f"+ in flight {st.in_flight} + buffered {st.buffered}  ({'balanced' if st.ledger_balanced else 'UNBALANCED'})")  # fmt: skip
    for r in st.history[-5:]:
        print(f"  step {r.step:>4}: reward {r.reward_mean:.3f} success {r.success_rate:.2f} "
              f"staleness {r.staleness_mean:.2f} (max {r.staleness_max}) samples {r.samples}")  # fmt: skip
    return 0


# ---------------------------------------------------------------- k8s


def _cmd_k8s_render(args: argparse.Namespace) -> int:
    from rollart.infra.k8s import write_manifests

    manifests = _k8s_manifests(args)
    for path in write_manifests(manifests, args.out):
        print(f"wrote {path}")
    print(f"inspect them, then `kubectl apply -f {args.out}` or `rollart k8s apply {args.job}`")
    return 0


def _cmd_k8s_apply(args: argparse.Namespace) -> int:
    from rollart.infra.k8s_apply import ApplyError, apply_manifests, connect

    manifests = _k8s_manifests(args)
    try:
        report = apply_manifests(connect(args.context), manifests, dry_run_only=args.dry_run)
    except ApplyError as e:
        raise _UserError(str(e)) from e
    for line in report.lines:
        print(line)
    print("applied." if report.applied else "dry run only: nothing was changed.")
    return 0


def _k8s_manifests(args: argparse.Namespace) -> list[dict]:
    from rollart.infra.k8s import K8sRenderError, render
    from rollart.infra.k8s_config import KubernetesConfig

    job = _load_job(args.job, argparse.Namespace())
    cfg = job.kubernetes or KubernetesConfig()
    flags = {"image": args.image, "gpu_image": args.gpu_image, "temporal_address": args.temporal_address}
    updates: dict[str, object] = {k: v for k, v in flags.items() if v}
    if args.hpa:
        updates["serverless"] = cfg.serverless.model_copy(update={"keda": False})
    try:
        if updates:
            job = job.model_copy(update={"kubernetes": KubernetesConfig.model_validate({**dict(cfg), **updates})})
        return render(job)
    except (K8sRenderError, ValueError) as e:
        raise _UserError(f"{args.job}: {e}") from e


# ---------------------------------------------------------------- shared


def _load_job(path: Path, args: argparse.Namespace) -> JobSpec:
    from rollart.infra.config import JobSpecError, load_job

    overrides: dict[str, object] = {}
    temporal = {k: v for k, v in {"address": getattr(args, "temporal_address", None),
                                  "namespace": getattr(args, "namespace", None)}.items() if v}  # fmt: skip
    if temporal:
        overrides["temporal"] = temporal
    try:
        return load_job(path, overrides)
    except JobSpecError as e:
        raise _UserError(str(e)) from e


def _default_job() -> JobSpec:
    from rollart.infra.config import JobSpec, TaskSpec

    return JobSpec(tasks=[TaskSpec(name="frozenlake", env="frozenlake", reward="success")])


def _home(args: argparse.Namespace) -> Path:
    from rollart.infra.config import DEFAULT_HOME

    return args.home or DEFAULT_HOME


def _prepare_local_stack(job: JobSpec) -> None:
    """Before this machine's workers start: the devices the job asks for exist, and the default model is built."""
    if job.trainer.device == "cuda":
        from rollart.activities.training.devices import DeviceUnavailable, resolve_device

        try:
            resolve_device("cuda")
        except DeviceUnavailable as e:
            raise _UserError(f"the job's trainer cannot run on this machine: {e}") from e
    _ensure_default_model(job)


def _ensure_default_model(job: JobSpec) -> None:
    """Build the embedded tiny model before workers start, so they don't race to build it."""
    from rollart.infra.config import JobSpec
    from rollart.infra.tiny_model import ensure_tiny_model

    if job.model_dir == JobSpec.model_fields["model_dir"].default and not (job.model_dir / "config.json").exists():
        print(f"building the tiny model in {job.model_dir} (first use) ...")
        ensure_tiny_model(job.model_dir)


if __name__ == "__main__":
    main()
