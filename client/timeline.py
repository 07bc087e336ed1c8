"""The rollout timeline of a job: every activity of its workflows, read from their histories.

Written by `rollart train` at the end as `timeline.jsonl` in the run dir, one
line per activity (pool, the pool's role in the job's declaration, type, start,
end), and drawn by `rollart plot` as each pool's busy time.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path

from temporalio.client import Client

from rollart.infra.temporal.history import activity_spans
from rollart.infra.temporal.search_attributes import JOB_ID
from rollart.spec.pools import DEFAULT_POOLS, PoolSpec

__all__ = ["collect_timeline", "write_timeline"]


async def collect_timeline(
    client: Client,
    job_id: str,
    limit: int = 5000,
    concurrency: int = 16,
    *,
    pools: Mapping[str, PoolSpec] = DEFAULT_POOLS,
    prefix: str = "",
) -> list[dict]:
    """Activities of the job's workflows (the training workflow's runs and its newest `limit` children), each with
    its pool's role in `pools` (the job's declaration; its queues carry `prefix`), so the plot needs no job."""
    ids: list[tuple[str, str]] = []
    async for wf in client.list_workflows(f'{JOB_ID.name} = "{job_id}"', limit=limit):
        ids.append((wf.id, wf.run_id))
    gate = asyncio.Semaphore(concurrency)

    async def spans(wid: str, run_id: str) -> list[dict]:
        async with gate:
            history = await client.get_workflow_handle(wid, run_id=run_id).fetch_history()
        return [
            {
                "workflow": wid,
                "pool": a.pool,
                "role": _role(pools, a.pool, prefix),
                "activity": a.activity_type,
                "start": a.started,
                "end": a.completed,
            }
            for a in activity_spans(history)
            if a.started and a.completed
        ]

    rows = [row for chunk in await asyncio.gather(*(spans(w, r) for w, r in ids)) for row in chunk]
    return sorted(rows, key=lambda r: r["start"])


def _role(pools: Mapping[str, PoolSpec], queue: str, prefix: str) -> str | None:
    """The declared role of the pool a (private queue's) task queue belongs to; None for a queue of no pool."""
    spec = pools.get(queue.removeprefix(prefix))
    return spec.role if spec is not None else None


def write_timeline(rows: list[dict], run_dir: Path) -> Path:
    """`timeline.jsonl` in the run dir."""
    path = run_dir / "timeline.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
