"""`rollart show`: one trajectory turn by turn, from its workflow's history and the payload store."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rollart.cli.errors import UserError
from rollart.cli.spec import add_temporal_args, load_spec

if TYPE_CHECKING:
    from rollart.client.trajectory_view import CallInfo, TrajectoryView, TurnView
    from rollart.spec.config import JobSpec

__all__ = ["add_parser", "add_reader_args", "reader_ui", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `show` and its flags."""
    s = sub.add_parser("show", help="print one trajectory turn by turn: observations, actions, tokens, workers, reward")
    s.add_argument("trajectory_id", help="a trajectory id (`rollart trajectories JOB_ID` lists them)")
    s.add_argument("--json", action="store_true", help="print the trajectory as one JSON object")
    s.add_argument(
        "--width",
        type=int,
        default=400,
        metavar="CHARS",
        help="longest observation or action printed in full; longer ones are cut (default 400, 0: all)",
    )
    add_reader_args(s)
    s.set_defaults(func=run)


def add_reader_args(s: argparse.ArgumentParser) -> None:
    """Where a finished job's records are: its server (--temporal-address, --namespace), store and UI."""
    s.add_argument("--job", type=Path, help="the job spec, for its server and store (default: the flags below)")
    add_temporal_args(s)
    s.add_argument(
        "--store-path",
        type=Path,
        help="the job's local store: tokens, logprobs and payloads kept out of history (default .rollart/store)",
    )
    s.add_argument("--ui-url", help="Temporal UI base URL for links (default: http://HOST:8233)")


def reader_ui(job: JobSpec, args: argparse.Namespace) -> str:
    """The Temporal UI base URL: --ui-url, else port 8233 on the server's host."""
    from rollart.infra.temporal.connection import DEFAULT_ADDRESS

    return args.ui_url or f"http://{(job.temporal.address or DEFAULT_ADDRESS).rsplit(':', 1)[0]}:8233"


def run(args: argparse.Namespace) -> int:
    """Print the trajectory; an id no workflow holds is a UserError (exit 2) saying how to list ids."""
    job = load_spec(args.job, args)
    view = asyncio.run(_load(job, args.trajectory_id))
    ui = _ui_link(view, job, args)
    if args.json:
        print(json.dumps(_as_json(view, ui), indent=2, default=str))
    else:
        print_view(view, ui, args.width)
    return 0


async def _load(job: JobSpec, trajectory_id: str) -> TrajectoryView:
    from temporalio.service import RPCError

    from rollart.client.trajectory_loader import TrajectoryNotFound, load_trajectory
    from rollart.infra.store.payload import open_store
    from rollart.infra.temporal.connection import connect

    try:
        client = await connect(job.temporal, job.store)
        return await load_trajectory(client, trajectory_id, open_store(job.store))
    except TrajectoryNotFound:
        raise UserError(
            f"no trajectory {trajectory_id!r} on {job.temporal.address or 'the local server'} "
            f"(namespace {job.temporal.namespace!r}); `rollart trajectories JOB_ID` lists a job's "
            "trajectory ids"
        ) from None
    except (ConnectionError, RPCError) as e:
        raise UserError(f"cannot read trajectory {trajectory_id!r}: {e}") from e


def _ui_link(view: TrajectoryView, job: JobSpec, args: argparse.Namespace) -> str:
    from rollart.infra.temporal.connection import ui_url

    return ui_url(reader_ui(job, args), job.temporal.namespace, view.workflow_id, view.run_id or None)


def _as_json(view: TrajectoryView, ui: str) -> dict:
    out = dataclasses.asdict(view)
    # every turn key, as written in the store: a history's JSON writes a run of them as a prefix and a count
    out["result"] = view.result.model_dump(mode="json") | {"turn_keys": view.result.turn_keys} if view.result else None
    out["ui"] = ui
    return out


def print_view(view: TrajectoryView, ui: str, width: int = 400) -> None:
    """The header (outcome, versions, workers, UI link), each turn, then the final observation and every call."""
    from rich.console import Console

    console = Console(width=max(120, Console().width), highlight=False, soft_wrap=True)
    for line in header_lines(view, ui):
        console.print(line, markup=False)
    for turn in view.turns:
        console.rule(f"turn {turn.index}", style="dim")
        for line in turn_lines(turn, width):
            console.print(line, markup=False)
    if view.final_observation:
        console.rule("final observation", style="dim")
        console.print(_cut(view.final_observation, width), markup=False)
    if view.calls:
        console.rule("activities", style="dim")
        for line in call_lines(view.calls):
            console.print(line, markup=False)
    sys.stdout.flush()


def header_lines(view: TrajectoryView, ui: str) -> list[str]:
    """What the trajectory was and how it ended."""
    r = view.result
    status = r.status if r else f"workflow {view.workflow_status}"
    lines = [f"trajectory {view.trajectory_id}: {status}"]
    if r:
        reward = f"{r.reward:.3f}" if r.reward is not None else "-"
        success = "-" if r.success is None else "yes" if r.success else "no"
        lines.append(
            f"task {r.task} · seed {r.seed} · reward {reward} · success {success} · {r.turns} turn(s) · "
            f"tokens {r.prompt_tokens} prompt + {r.completion_tokens} completion"
        )
        lines.append(
            f"policy versions {view.versions} · env worker {r.env_worker or '-'} · restores {r.restores}"
            + (f" · group {r.group_id}" if r.group_id else "")
            + (f" · completion {r.completion_index} of the group's generation" if r.group_id and r.turns == 1 else "")
        )
    else:
        lines.append(f"{len(view.turns)} turn(s) recorded · policy versions {view.versions}")
    if view.error:
        lines.append(f"error: {view.error}")
    lines.append(f"workflow {view.workflow_type} {view.workflow_id} ({view.workflow_status})")
    lines.append(f"Temporal UI: {ui}")
    return lines


def turn_lines(turn: TurnView, width: int = 400) -> list[str]:
    """One turn: observation, action, tokens and logprobs, the env's answer, the calls that played it."""
    lines = [f"observation: {_cut(turn.observation, width)}", f"action: {_cut(turn.action, width)}"]
    tokens = f"tokens: prompt {_n(turn.prompt_tokens)}, completion {_n(turn.completion_tokens)}"
    if turn.finish_reason:
        tokens += f" ({turn.finish_reason})"
    lp = turn.logprobs
    tokens += (
        f" · logprobs mean {lp.mean:.3f} min {lp.min:.3f} sum {lp.total:.2f} (perplexity {lp.perplexity:.2f})"
        if lp
        else f" · logprobs: {turn.store_note or '-'}"
    )
    if turn.policy_version is not None:
        same = turn.policy_version == turn.policy_version_end
        tokens += f" · policy v{turn.policy_version}" + ("" if same else f"→v{turn.policy_version_end}")
    lines.append(tokens)
    reward = f"{turn.env_reward:g}" if turn.env_reward is not None else "-"
    done = "-" if turn.done is None else "yes" if turn.done else "no"
    info = json.dumps(turn.info, default=str, sort_keys=True) if turn.info else "{}"
    lines.append(f"env: reward {reward} · done {done} · info {info}")
    calls = [f"{c.activity} on {c.worker or '?'} {_secs(c)}" for c in (turn.generate, turn.step) if c is not None]
    if calls:
        lines.append("calls: " + " · ".join(calls))
    return lines


def call_lines(calls: list[CallInfo]) -> list[str]:
    """Every activity of the workflow: type, queue, worker, run and wait times."""
    return [
        f"{c.activity:<15} {c.queue:<28} {c.worker or '?':<28} {_secs(c)}" + ("" if c.succeeded else "  FAILED")
        for c in calls
    ]


def _secs(c: CallInfo) -> str:
    return f"{c.run_s:.3f}s (queued {c.wait_s:.3f}s)"


def _n(x: int | None) -> str:
    return "-" if x is None else str(x)


def _cut(text: str, width: int) -> str:
    one = text.replace("\n", "⏎ ")
    return one if width <= 0 or len(one) <= width else one[:width] + f"… (+{len(one) - width} chars)"
