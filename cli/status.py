"""`rollart status`: a training job's live status: step, version, the trajectory ledger, recent rewards."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rollart.cli.errors import UserError
from rollart.cli.spec import add_temporal_security_args, load_spec

if TYPE_CHECKING:
    from temporalio.client import Client, WorkflowHandle

    from rollart.client.connection import Outage
    from rollart.contracts.training import TrainingStatus

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `status`; unlike the other commands its server defaults to 127.0.0.1:7233, not a local stack."""
    s = sub.add_parser("status", help="print a training job's live status (step, ledger, last rewards)")
    s.add_argument("job_id", help="the job id `rollart train` printed (= the TrainingWorkflow's id)")
    s.add_argument("--temporal-address", metavar="HOST:PORT", default="127.0.0.1:7233", help="Temporal server")
    s.add_argument("--namespace", default="default", help="Temporal namespace")
    add_temporal_security_args(s)
    s.add_argument(
        "--store-path",
        type=Path,
        help="the job's local store, for payloads kept out of history (default .rollart/store)",
    )
    s.add_argument(
        "--follow",
        action="store_true",
        help="keep printing the status (a line per new step) until the job ends; rides out server outages",
    )
    s.add_argument("--interval", type=float, default=2.0, help="seconds between polls with --follow (default 2)")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Query the TrainingWorkflow and print its state and ledger: once, or with --follow until the job ends."""
    return asyncio.run(_status(args))


async def _status(args: argparse.Namespace) -> int:
    from temporalio.service import RPCError

    from rollart.client.connection import Outage, connect_retrying, retry_unreachable
    from rollart.client.train import status_of
    from rollart.infra.temporal.connection import connect

    job = load_spec(None, args)  # the connection settings: the defaults with --temporal-address and --namespace
    try:
        if args.follow:
            outage = Outage()
            client = await connect_retrying(job.temporal, job.store, outage, give_up_after_s=60)
            handle = client.get_workflow_handle(args.job_id)
            st = await retry_unreachable(lambda: status_of(handle), outage)
        else:
            client = await connect(job.temporal, job.store)
            st = await _answer(client, client.get_workflow_handle(args.job_id))
    except (ConnectionError, RPCError) as e:
        raise UserError(f"cannot get the status of {args.job_id!r} from {args.temporal_address}: {e}") from e
    _print_status(st)
    if args.follow:
        await _follow(client, handle, st, outage, args.interval)
    return 0


async def _follow(
    client: Client, handle: WorkflowHandle, st: TrainingStatus, outage: Outage, interval_s: float
) -> None:
    """A line per step the job finishes, then the whole status once it is done."""
    from rollart.client.connection import probe, retry_unreachable
    from rollart.client.train import status_of
    from rollart.client.unserved import Unserved

    last, unserved = st.step, Unserved()
    while not st.done:
        await asyncio.sleep(outage.next_delay() if outage.down else interval_s)
        if not await probe(client, outage):
            continue
        try:
            st = await asyncio.wait_for(retry_unreachable(lambda: status_of(handle), outage), QUERY_WAIT_S)
        except TimeoutError:
            await unserved.no_answer(client, handle)
            continue
        unserved.answered()
        for r in st.history:
            if r.step >= last:
                print(
                    f"  step {r.step:>4}: reward {r.reward_mean:.3f} success {r.played_success:.2f} "
                    f"staleness {r.staleness_mean:.2f} (max {r.staleness_max}) samples {r.samples}",
                    flush=True,
                )
        last = st.step
    _print_status(st)


QUERY_WAIT_S = 10.0
"""How long `rollart status` waits for the job to answer before it asks Temporal whether anybody serves it."""


async def _answer(client: Client, handle: WorkflowHandle) -> TrainingStatus:
    """The status query; unanswered within QUERY_WAIT_S, a UserError saying why (no worker serves the job, say)."""
    from rollart.client.train import status_of
    from rollart.client.unserved import unserved

    try:
        return await asyncio.wait_for(status_of(handle), QUERY_WAIT_S)
    except TimeoutError:
        why = await unserved(client, handle)
        raise UserError(
            why
            or f"job {handle.id!r} did not answer its status query within {QUERY_WAIT_S:.0f} s "
            "(its worker is busy or slow); try again"
        ) from None


def engine_lines(st: TrainingStatus) -> list[str]:
    """The admission cap and each engine's last report: what `training.admission` and `engine.affinity` act on."""
    lines = []
    if st.admission_cap is not None:
        cuts = f"{st.admission_cuts} time{'' if st.admission_cuts == 1 else 's'}"
        lines.append(
            f"admission: at most {st.admission_cap} in flight by engine pressure (the async bound allows "
            f"{st.in_flight_limit} in flight + buffered; cut {cuts})"
        )
    if st.engines:
        lines.append(f"engines: {len(st.engines)} reporting; turns moved between engines: {st.engine_moves}")
    for worker, p in st.engines.items():
        hits = f"{p.prefix_hit_rate:.0%}" if p.prefix_hit_rate is not None else "-"
        lines.append(
            f"  {worker}: {p.running} running, {p.waiting} waiting, KV {p.kv_usage:.0%}, "
            f"{p.preempted} preempted, prefix-cache hits {hits}"
        )
    return lines + placement_lines(st)


def placement_lines(st: TrainingStatus) -> list[str]:
    """Where `generate_pool: auto` tasks generate, why, and the pools' rates the plan used."""
    p = st.placement
    if p is None:
        return []
    lines = [f"{p.describe()}; {p.plans} plan(s), {p.moves} moved tasks", *(f"  {r}" for r in p.reasons)]
    for pool, (engines, prefill, decode) in p.rates.items():
        lines.append(f"  {pool}: {engines} engine(s), prefill {prefill:,.0f} tokens/s, decode {decode:,.0f} tokens/s")
    return lines


def _print_status(st: TrainingStatus) -> None:
    """State, step and version, the ledger, the last five steps."""
    state = "done" if st.done else "stopping" if st.stopping or st.ended_by else "paused" if st.paused else "running"
    if st.ended_by == "stop_when":
        state += " (learned)"
    print(
        f"job {st.job_id}: {state}, step {st.step}/{st.steps} (policy v{st.version}), "
        f"{st.rollout_mode} rollout, async bound {st.async_bound}"
    )
    filtered = f"filtered {st.filtered} + " if st.filtered else ""
    print(
        f"trajectories: started {st.started} = trained {st.trained} + dropped {st.dropped} + {filtered}"
        f"failed {st.failed} + in flight {st.in_flight} + buffered {st.buffered}  "
        f"({'balanced' if st.ledger_balanced else 'UNBALANCED'})"
    )
    if (rule := st.stop_when) is not None:  # training.stop_when
        if st.ended_by == "stop_when":
            print(f"learned: {rule.describe()}")
        else:
            print(
                f"stop rule: success ≥ {rule.success:g} for {rule.steps} steps in a row; held for {st.stop_held} so far"
            )
    for line in engine_lines(st):
        print(line)
    for stall in st.stalls:  # a pool with work waiting and no worker, or no trajectory finishing (training.stall)
        print(
            f"STALLED: {stall.describe(time.time())} (since {time.strftime('%H:%M:%S', time.localtime(stall.since))})"
        )
    for r in st.history[-5:]:
        print(
            f"  step {r.step:>4}: reward {r.reward_mean:.3f} success {r.played_success:.2f} "
            f"staleness {r.staleness_mean:.2f} (max {r.staleness_max}) samples {r.samples}"
        )
    sys.stdout.flush()
