"""Clients that outlive their server and their terminal: following through an outage, `rollart attach`, Ctrl-C.

A dev server of the module's own (fixed port, SQLite file) runs the jobs; stand-in workers in this process
(tests/support/standins.py, on a queue prefix of each test's own) do the work, so a job is a few seconds of
orchestration. The outage test SIGKILLs that server and starts it again on the same port and file.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowExecutionStatus

from rollart.client.connection import Outage
from rollart.client.rollout import plan_trajectories, run_rollout
from rollart.client.train import MetricsWriter, follow, start_training
from rollart.contracts.training import TrainingResult, TrainingStatus
from rollart.infra.local.devserver import DevServer, free_port
from rollart.infra.temporal.connection import connect
from rollart.spec.config import JobSpec, StoreConfig, TemporalConfig, TrainingConfig
from tests.support.paths import REPO
from tests.support.standins import StandIns, full_marks, standin_workers
from tests.support.tasks import frozenlake_task, with_queue_prefix

ROLLART = [sys.executable, "-m", "rollart.cli"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    """A dev server on a fixed port and SQLite file, so that it can be stopped and started again as the same."""
    home = tmp_path_factory.mktemp("outage")
    s = DevServer(db_file=home / "temporal.db", port=free_port(), ui_port=None, log_file=home / "temporal.log")
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
async def server_client(server: DevServer) -> AsyncIterator[Client]:
    yield await connect(TemporalConfig(address=server.address), _store(server))


def _store(server: DevServer) -> StoreConfig:
    return StoreConfig(path=server.db_file.parent / "store")


def _job(prefix: str, steps: int) -> JobSpec:
    """Two-member FrozenLake groups, batches of 4, on the test's queues."""
    spec = JobSpec(
        name="outage",
        tasks=[frozenlake_task(group_size=2, max_turns=2)],
        training=TrainingConfig(steps=steps, batch_size=4, async_bound=1),
    )
    return with_queue_prefix(spec, prefix)


def _world(prefix: str, train_delay_s: float) -> StandIns:
    return StandIns(prefix=prefix, turns=1, stagger=1, score=full_marks, train_delay_s=train_delay_s, turn_delay_s=0.02)


async def _until_async(check: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    """Wait until `await check()` holds: a generous deadline, never a fixed window that load can outlast."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout_s}s")
        await asyncio.sleep(0.2)


async def _until(check: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout_s}s")
        await asyncio.sleep(0.1)


@pytest.mark.chaos
@pytest.mark.timeout(180)
async def test_followers_ride_out_a_server_outage(
    server: DevServer, server_client: Client, tmp_path: Path, queue_prefix: str
) -> None:
    """`follow` in this process, `rollart attach` and `rollart status --follow` follow one job through a 20 s outage."""
    w, steps = _world(queue_prefix, train_delay_s=0.5), 16
    job_id = f"outage-{uuid.uuid4().hex[:6]}"
    events: list[tuple[float, str]] = []
    rows: list[dict] = []
    address = ("--temporal-address", server.address, "--store-path", str(_store(server).path))
    async with standin_workers(server_client, w):
        handle = await start_training(server_client, _job(queue_prefix, steps), job_id, tmp_path / job_id)
        outage = Outage(say=lambda line: events.append((time.monotonic(), line)), max_delay_s=2.0)
        following = asyncio.create_task(
            follow(
                handle, MetricsWriter(tmp_path / job_id), rows.append, poll_s=0.2, outage=outage, client=server_client
            )
        )
        attach = await _cli("attach", job_id, *address, "--run-dir", str(tmp_path / "attached"))
        status = await _cli("status", job_id, *address, "--follow", "--interval", "0.5")
        seen: list[str] = []
        await _read_until(attach, "step 2/", 60, seen)
        assert len(rows) < steps - 4, "the job ran too far before the outage"
        t_kill = time.monotonic()
        os.kill(server.pid, signal.SIGKILL)  # type: ignore[arg-type]
        await asyncio.to_thread(server.stop)
        await asyncio.sleep(20)
        t_up = time.monotonic()
        await asyncio.to_thread(server.start)
        t_healthy = time.monotonic()
        result: TrainingResult = await asyncio.wait_for(following, 90)
        t_end = time.monotonic()
        attached = "".join(seen) + (await asyncio.wait_for(attach.communicate(), 60))[0].decode(errors="replace")
        statused = (await asyncio.wait_for(status.communicate(), 60))[0].decode(errors="replace")
        final = await handle.query("status", result_type=TrainingStatus)
    timeline = {
        "killed": 0.0,
        "restart begun": t_up - t_kill,
        "healthy": t_healthy - t_kill,
        **{line.split(" (")[0]: t - t_kill for t, line in events},
        "job end": t_end - t_kill,
    }
    print("outage timeline (s after the kill):", {k: round(v, 1) for k, v in timeline.items()})
    said = [line for _, line in events]
    assert sum("Temporal unreachable, retrying" in line for line in said) == 1, said
    assert sum(line.startswith("Temporal is back after") for line in said) == 1, said
    assert events[0][0] - t_kill < 7  # noticed within a poll or two, not after the SDK's ~10 s of retries
    assert result.steps == steps and result.version == steps
    assert [r["step"] for r in rows] == list(range(steps))  # the bar resumed where the job was, no step twice
    assert final.done and final.ledger_balanced
    assert result.failed == 0 and final.failed == 0
    by_step: dict[int, set[str]] = {}  # a train_step whose answer the outage lost is retried: same step, same batch
    for inp in w.inputs("train_step"):
        ids = {x.trajectory_id for x in inp.samples}
        assert by_step.setdefault(inp.step, ids) == ids
    assert sum(len(ids) for ids in by_step.values()) == len(set().union(*by_step.values())) == result.trained
    for name, proc, out in (("attach", attach, attached), ("status --follow", status, statused)):
        assert proc.returncode == 0, f"{name}:\n{out}"
        assert out.count("Temporal unreachable, retrying") == 1 and out.count("Temporal is back after") == 1, out
    assert f"done: {steps} steps, policy v{steps}" in attached
    assert len((tmp_path / "attached" / "metrics.jsonl").read_text().splitlines()) == steps
    assert f"job {job_id}: done, step {steps}/{steps}" in statused


async def _read_until(proc: asyncio.subprocess.Process, needle: str, timeout_s: float, seen: list[str]) -> None:
    """Read the process's output into `seen` until a line holds `needle`."""
    assert proc.stdout is not None

    async def read() -> None:
        while True:
            line = (await proc.stdout.readline()).decode(errors="replace")  # type: ignore[union-attr]
            if not line:
                raise AssertionError(f"exited ({proc.returncode}) before {needle!r}:\n" + "".join(seen))
            seen.append(line)
            if needle in line:
                return

    try:
        await asyncio.wait_for(read(), timeout_s)
    except TimeoutError:
        raise AssertionError(f"no {needle!r} within {timeout_s}s:\n" + "".join(seen)) from None


async def _cli(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *ROLLART, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=REPO
    )


@pytest.mark.integration
@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", [["attach", "{job}", "--store-path", "{store}"], ["train", "--attach", "{job}"]])
async def test_attach_follows_a_running_job_to_its_end(
    server: DevServer, server_client: Client, tmp_path: Path, queue_prefix: str, command: list[str]
) -> None:
    w, steps = _world(queue_prefix, train_delay_s=1.0), 6
    job_id = f"attach-{uuid.uuid4().hex[:6]}"
    run_dir = tmp_path / job_id
    async with standin_workers(server_client, w):
        handle = await start_training(server_client, _job(queue_prefix, steps), job_id, run_dir)
        args = [a.format(job=job_id, store=_store(server).path) for a in command]
        proc = await _cli(*args, "--temporal-address", server.address)
        seen: list[str] = []
        try:
            await _read_until(proc, f"run dir {run_dir}", 60, seen)  # the run dir the job was started with
            await _read_until(proc, f"step {steps}/{steps}", 60, seen)
            await _read_until(proc, "done: ", 60, seen)
            rest, _ = await asyncio.wait_for(proc.communicate(), 60)
        finally:
            if proc.returncode is None:
                proc.kill()
        result = await handle.result()
    out = "".join(seen) + rest.decode(errors="replace")
    assert proc.returncode == 0, out
    assert f"done: {steps} steps, policy v{steps}" in out and result.steps == steps
    written = [line for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    assert len(written) == steps  # every step once, from the job's own history


@pytest.mark.integration
@pytest.mark.timeout(120)
async def test_ctrl_c_on_a_remote_server_detaches_and_says_how_to_attach(
    server: DevServer, server_client: Client, tmp_path: Path, queue_prefix: str
) -> None:
    w = _world(queue_prefix, train_delay_s=0.3)
    spec = tmp_path / "job.json"
    spec.write_text(_job(queue_prefix, steps=1000).model_copy(update={"store": _store(server)}).model_dump_json())
    async with standin_workers(server_client, w):
        proc = await _cli("train", str(spec), "--temporal-address", server.address, "--run-dir", str(tmp_path / "run"))
        seen: list[str] = []
        try:
            await _read_until(proc, "step 2/1000", 60, seen)
            job_id = next(line.split()[1].rstrip(":") for line in seen if line.startswith("job "))
            proc.send_signal(signal.SIGINT)
            rest, _ = await asyncio.wait_for(proc.communicate(), 60)
        finally:
            if proc.returncode is None:
                proc.kill()
        out = "".join(seen) + rest.decode(errors="replace")
        assert proc.returncode == 130, out
        assert f"interrupted: job {job_id} keeps running on {server.address}" in out
        assert f"rollart attach {job_id} --temporal-address {server.address}" in out
        handle = server_client.get_workflow_handle(job_id, result_type=TrainingResult)
        before = (await handle.query("status", result_type=TrainingStatus)).step
        steps: list[int] = []

        async def advanced() -> bool:
            steps.append((await handle.query("status", result_type=TrainingStatus)).step)
            return steps[-1] > before

        await _until_async(advanced, 60, f"step after {before} (saw {steps})")  # still training, detached
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        await handle.signal("stop")
        result = await asyncio.wait_for(handle.result(), 60)
    assert result.steps < 1000


@pytest.mark.chaos
async def test_rollout_rides_out_a_server_outage(server: DevServer, server_client: Client, queue_prefix: str) -> None:
    """`run_rollout` (what `rollart rollout` runs) waits out a 15 s outage: every trajectory completes."""
    w = StandIns(prefix=queue_prefix, turns=12, score=full_marks, turn_delay_s=0.5)
    spec = with_queue_prefix(JobSpec(name="outage", tasks=[frozenlake_task(group_size=2, max_turns=12)]), queue_prefix)
    said: list[str] = []
    async with standin_workers(server_client, w):
        inputs = plan_trajectories(spec, 4, seed=0, job_id=f"ro-{uuid.uuid4().hex[:6]}")
        rolling = asyncio.create_task(
            run_rollout(server_client, inputs, inputs[0].job_id, outage=Outage(say=said.append, max_delay_s=2.0))
        )
        await _until(lambda: len(w.called("generate")) >= 8, 60, "two turns each")
        os.kill(server.pid, signal.SIGKILL)  # type: ignore[arg-type]
        await asyncio.to_thread(server.stop)
        await asyncio.sleep(15)
        await asyncio.to_thread(server.start)
        outcomes = await asyncio.wait_for(rolling, 90)
    assert [o.status for o in outcomes] == ["completed"] * 4
    assert sum("Temporal unreachable, retrying" in line for line in said) == 1, said
    assert sum(line.startswith("Temporal is back after") for line in said) == 1, said
