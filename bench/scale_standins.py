"""The activity side of `python -m bench scale`, as its own process: the test suite's stand-in activities
(tests/support/standins.py) with a fixed-latency engine and the env latency model of bench/workload.py.

    python -m bench.scale_standins ADDRESS --store DIR [--prefix P] [--generate-s 0.05] [--turns 2]

Every queue a training job routes to (cpu, the env sessions' queue, h800, h20, serverless, trainer) gets a
worker serving what a real worker of that pool serves; `control` is left to the real control worker
processes the bench starts, so only orchestration is measured. Writes READY to stdout once polling.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.worker import Worker

from bench.workload import LATENCY
from rollart.contracts.activities import EnvHandle, GroupHandle, GroupResetInput, GroupStepInput, ResetInput, StepInput
from rollart.infra.temporal.connection import connect
from rollart.spec.config import LatencyModel, StoreConfig, TemporalConfig
from rollart.spec.pools import queue_name
from tests.support.standins import StandIns

__all__ = ["EnvLatencyStandIns", "main"]

MAX_CONCURRENT = 4096
"""Activities one stand-in worker runs at once: above the largest in-flight count the bench asks for."""


class EnvLatencyStandIns(StandIns):
    """StandIns whose resets and steps wait as the env latency model says, and whose sessions accept a
    queue wait of up to the default sticky timeout (the stand-in's 1 s is for tests that kill workers)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reset_latency = LatencyModel(median_s=LATENCY["reset_median_s"], p99_s=LATENCY["reset_p99_s"])
        self.step_latency = LatencyModel(median_s=LATENCY["step_median_s"], p99_s=LATENCY["step_p99_s"])
        self.rng = random.Random(0)  # one event loop: no lock needed

    @activity.defn(name="reset")
    async def reset(self, inp: ResetInput) -> EnvHandle:
        await asyncio.sleep(self.reset_latency.draw(self.rng))
        handle = await super().reset(inp)
        return handle.model_copy(update={"sticky_start_s": EnvHandle.model_fields["sticky_start_s"].default})

    @activity.defn(name="reset_group")
    async def reset_group(self, inp: GroupResetInput) -> GroupHandle:
        await asyncio.sleep(self.reset_latency.draw(self.rng))
        handle = await super().reset_group(inp)
        return handle.model_copy(update={"sticky_start_s": GroupHandle.model_fields["sticky_start_s"].default})

    @activity.defn(name="step")
    async def step(self, inp: StepInput) -> Any:
        await asyncio.sleep(self.step_latency.draw(self.rng))
        return await super().step(inp)

    @activity.defn(name="step_group")
    async def step_group(self, inp: GroupStepInput) -> Any:
        await asyncio.sleep(self.step_latency.draw(self.rng))
        return await super().step_group(inp)


async def serve(address: str, store: Path, prefix: str, generate_s: float, turns: int) -> None:
    """Poll every non-control queue until cancelled; calls are not recorded (a long run would keep them all).
    The client is the workers' own (rollart's data converter and the store for large payloads)."""
    client = await connect(TemporalConfig(address=address), StoreConfig(path=store))
    s = EnvLatencyStandIns(prefix=prefix, turns=turns, turn_delay_s=generate_s)
    s._record = lambda *_: None  # type: ignore[method-assign]  # the bench reads histories, not calls
    engine = [s.generate, s.generate_batch]
    queues = {
        queue_name("cpu", prefix): [s.reset, s.reset_group, s.restore, s.prompts, s.check],
        s.session_queue: [s.step, s.step_group, s.close],
        queue_name("h800", prefix): engine,
        queue_name("h20", prefix): engine,
        queue_name("serverless", prefix): [s.reward, s.reward_batch],
        queue_name("trainer", prefix): [s.train_step],
    }
    workers = [
        Worker(client, task_queue=q, activities=acts, max_concurrent_activities=MAX_CONCURRENT)
        for q, acts in queues.items()
    ]
    async with contextlib.AsyncExitStack() as running:
        for w in workers:
            await running.enter_async_context(w)
        print("READY", flush=True)
        await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale_standins", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("address")
    parser.add_argument("--store", type=Path, required=True, help="the job's local store directory")
    parser.add_argument("--prefix", default="")
    parser.add_argument("--generate-s", type=float, default=0.05, help="fixed latency of every generate call")
    parser.add_argument("--turns", type=int, default=2, help="steps until a stand-in episode is done")
    args = parser.parse_args()
    try:
        asyncio.run(serve(args.address, args.store, args.prefix, args.generate_s, args.turns))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
