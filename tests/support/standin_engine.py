"""A stand-in generation worker in a process of its own, to be SIGKILLed: serves `generate` on PREFIX + h800.

`python -m tests.support.standin_engine ADDRESS PREFIX STORE_DIR` connects as rollart's workers do (worker
heartbeats every second), prints "serving" once its worker polls, and serves until killed.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from temporalio.worker import Worker

from rollart.infra.temporal.connection import connect
from rollart.spec.config import StoreConfig, TemporalConfig
from rollart.spec.pools import queue_name
from tests.support.standins import StandIns, full_marks


async def serve(address: str, prefix: str, store: Path) -> None:
    client = await connect(TemporalConfig(address=address, worker_heartbeat_s=1.0), StoreConfig(path=store))
    s = StandIns(prefix=prefix, turns=1, stagger=1, score=full_marks, turn_delay_s=0.2)
    async with Worker(client, task_queue=queue_name("h800", prefix), activities=[s.generate, s.generate_batch]):
        print("serving", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
