"""`rollart rollout`: run N trajectories of a job and print their outcomes, one row each, and each failure's reason
whole under the table."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rollart.cli.errors import UserError
from rollart.cli.spec import add_temporal_args, check_components, load_spec
from rollart.cli.stack import add_stack_args, connect_client, server_for

if TYPE_CHECKING:
    from rollart.client.rollout import RolloutOutcome
    from rollart.spec.config import JobSpec

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `rollout` and its flags."""
    s = sub.add_parser("rollout", help="run N trajectories of a job and print their outcomes")
    s.add_argument("job", type=Path, help="job spec (YAML or JSON)")
    s.add_argument("-n", "--num", type=int, default=16, help="number of trajectories (default 16)")
    s.add_argument("--seed", type=int, default=0, help="seed for task draws and env seeds")
    add_temporal_args(s)
    s.add_argument("--ui-url", help="Temporal UI base URL for links (default: http://HOST:8233)")
    add_stack_args(s)
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Exit 0 only if every trajectory completed; starts (and stops) the local stack when no server is given."""
    if args.num < 1:
        raise UserError("-n must be at least 1")
    job = load_spec(args.job, args)
    check_components(job, args.job)
    with server_for(job, args, training=False) as server:
        return asyncio.run(_rollout(server.job, args, server.ui))


async def _rollout(job: JobSpec, args: argparse.Namespace, ui: str) -> int:
    from rollart.cli.progress import progress_bar
    from rollart.client.connection import Outage
    from rollart.client.rollout import new_job_id, plan_trajectories, run_rollout

    client = await connect_client(job)
    job_id = new_job_id(job)
    inputs = plan_trajectories(job, args.num, args.seed, job_id)
    print(f"job {job_id}: starting {len(inputs)} trajectories on queue 'control'")
    t0 = time.monotonic()
    with progress_bar() as bar:
        task = bar.add_task("trajectories", total=len(inputs), stats="")
        wins = [0, 0]

        def done(o: RolloutOutcome) -> None:
            wins[0] += bool(o.result and o.result.success)
            wins[1] += 1
            bar.update(task, advance=1, stats=f"success {wins[0]}/{wins[1]}")

        outage = Outage(say=lambda line: print(line, flush=True))  # above the bar: rich redirects stdout
        outcomes = await run_rollout(client, inputs, job_id, on_done=done, outage=outage)
    wall = time.monotonic() - t0
    _print_table(job_id, outcomes, ui, job.temporal.namespace)
    for line in failure_lines(outcomes):
        print(line)
    _print_summary(outcomes, wall)
    return 0 if all(o.status == "completed" for o in outcomes) else 1


def _failure(o: RolloutOutcome) -> tuple[str, str]:
    """How a trajectory that did not complete ended: its status, and its result's error or else its workflow's."""
    return o.status, (o.result.error if o.result else o.error) or "(no reason given)"


def _failures(outcomes: list[RolloutOutcome]) -> dict[tuple[str, str], int]:
    """Each distinct failure (status, reason) and how many ended so, in order of first appearance."""
    counts: dict[tuple[str, str], int] = {}
    for o in outcomes:
        if o.status != "completed":
            counts[_failure(o)] = counts.get(_failure(o), 0) + 1
    return counts


def failure_lines(outcomes: list[RolloutOutcome]) -> list[str]:
    """One line per distinct failure, its reason whole (the table's status column gives only its number):
    `failed #1: 3 × <reason>`."""
    return [f"{status} #{k}: {n} × {reason}" for k, ((status, reason), n) in enumerate(_failures(outcomes).items(), 1)]


def _print_table(job_id: str, outcomes: list[RolloutOutcome], ui: str, namespace: str) -> None:
    from rich.console import Console
    from rich.table import Table

    from rollart.infra.temporal.connection import ui_url

    table = Table(title=f"job {job_id}")
    for col in ("#", "task", "seed", "status", "reward", "success", "turns", "versions"):
        table.add_column(col, overflow="fold")
    table.add_column("Temporal UI", no_wrap=True)
    numbered = {f: k for k, f in enumerate(_failures(outcomes), 1)}  # the reasons: whole, under it (failure_lines)
    for i, o in enumerate(outcomes):
        r = o.result
        versions = f"{r.policy_version_min}..{r.policy_version_max}" if r and r.policy_version_min is not None else "-"
        status = o.status if o.status == "completed" else f"[red]{o.status}[/red] #{numbered[_failure(o)]}"
        table.add_row(
            str(i),
            o.inp.task.name,
            str(o.inp.seed),
            status,
            f"{r.reward:.3f}" if r and r.reward is not None else "-",
            ("yes" if r.success else "no") if r and r.success is not None else "-",
            str(r.turns) if r else "-",
            versions,
            ui_url(ui, namespace, o.workflow_id) if ui else o.workflow_id,
        )
    console = Console(width=max(170, Console().width))
    console.print(table)


def _print_summary(outcomes: list[RolloutOutcome], wall: float) -> None:
    from rollart.spec.routing import Unit, unit_of

    done = [o.result for o in outcomes if o.result and o.status == "completed"]
    turns: dict[str, int] = {}  # per workflow: a group plays its longest member's turns, one call per turn for all
    waves: set[str] = set()  # single-turn groups: prompts, generate_batch, check, reward_batch
    for o in outcomes:
        if o.result and o.status == "completed":
            turns[o.workflow_id] = max(turns.get(o.workflow_id, 0), o.result.turns)
            if unit_of(o.inp.task) is Unit.SINGLE_TURN_WAVE:
                waves.add(o.workflow_id)
    # reset, (generate + step) per turn, reward, close; a wave's four calls
    activities = sum(4 if wid in waves else 2 * t + 3 for wid, t in turns.items())
    rewards = [r.reward for r in done if r.reward is not None]
    print(
        f"{len(done)}/{len(outcomes)} completed in {wall:.1f}s · {len(outcomes) / wall:.2f} trajectories/s · "
        f"{activities / wall:.1f} activities/s · success {sum(bool(r.success) for r in done)}/{len(done)} · "
        f"mean reward {statistics.fmean(rewards) if rewards else float('nan'):.3f}"
    )
