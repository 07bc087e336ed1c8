"""`rollart status`: a training job's live status: step, version, the trajectory ledger, recent rewards."""

from __future__ import annotations

import argparse
import asyncio
import time

from rollart.cli.errors import UserError
from rollart.cli.spec import load_spec

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `status`; unlike the other commands its server defaults to 127.0.0.1:7233, not a local stack."""
    s = sub.add_parser("status", help="print a training job's live status (step, ledger, last rewards)")
    s.add_argument("job_id", help="the job id `rollart train` printed (= the TrainingWorkflow's id)")
    s.add_argument("--temporal-address", metavar="HOST:PORT", default="127.0.0.1:7233", help="Temporal server")
    s.add_argument("--namespace", default="default", help="Temporal namespace")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Query the TrainingWorkflow once and print its state and ledger."""
    return asyncio.run(_status(args))


async def _status(args: argparse.Namespace) -> int:
    from rollart.client.train import status_of
    from rollart.infra.temporal import connect
    from temporalio.service import RPCError

    job = load_spec(None, args)  # the connection settings: the defaults with --temporal-address and --namespace
    try:
        client = await connect(job.temporal, job.store)
        st = await status_of(client.get_workflow_handle(args.job_id))
    except (ConnectionError, RPCError) as e:
        raise UserError(f"cannot get the status of {args.job_id!r} from {args.temporal_address}: {e}") from e
    state = "done" if st.done else "stopping" if st.stopping else "paused" if st.paused else "running"
    print(f"job {st.job_id}: {state}, step {st.step}/{st.steps} (policy v{st.version}), "
          f"{st.rollout_mode} rollout, async bound {st.async_bound}")  # fmt: skip
    print(f"trajectories: started {st.started} = trained {st.trained} + dropped {st.dropped} + failed {st.failed} "
          f"+ in flight {st.in_flight} + buffered {st.buffered}  ({'balanced' if st.ledger_balanced else 'UNBALANCED'})")  # fmt: skip
    for stall in st.stalls:  # a pool with work waiting and no worker, or no trajectory finishing (training.stall)
        print(f"STALLED: {stall.describe(time.time())} (since {time.strftime('%H:%M:%S', time.localtime(stall.since))})")
    for r in st.history[-5:]:
        print(f"  step {r.step:>4}: reward {r.reward_mean:.3f} success {r.success_rate:.2f} "
              f"staleness {r.staleness_mean:.2f} (max {r.staleness_max}) samples {r.samples}")  # fmt: skip
    return 0
