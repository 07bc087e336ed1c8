"""Workers wait for their server, keep serving across its restarts, and leave no process behind when killed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest
from temporalio.worker import Worker

from rollart.contracts.activities import EnvHandle
from rollart.infra.local.devserver import DevServer, free_port
from rollart.infra.temporal.connection import connect
from rollart.spec.config import StoreConfig, TemporalConfig
from rollart.workers import lifeline
from tests.support.cli import rollart
from tests.support.one_reset import OneReset
from tests.support.paths import REPO

ROLLART = [sys.executable, "-m", "rollart.cli"]


class Lines:
    """A process's merged output, read by a thread so that a test can wait for a line without blocking on it."""

    def __init__(self, cmd: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_for(self, needle: str, timeout_s: float) -> float:
        """Seconds until a line containing `needle` appeared; fails with the output so far."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if any(needle in line for line in self.lines):
                return time.monotonic() - t0
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"no {needle!r} within {timeout_s}s (exit {self.proc.poll()}):\n{self.text}")

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _cpu_worker(address: str, store: Path, prefix: str, *extra: str) -> Lines:
    return Lines(
        [
            *ROLLART,
            "worker",
            "--pool",
            "cpu",
            "--temporal-address",
            address,
            "--store-path",
            str(store),
            "--task-queue-prefix",
            prefix,
            *extra,
        ]
    )


async def _one_reset(address: str, store: Path, prefix: str, timeout_s: float = 30.0) -> EnvHandle:
    """Run one `reset` through the server on `<prefix>cpu`; the workflow runs in this process."""
    client = await connect(TemporalConfig(address=address), StoreConfig(path=store))
    queue = f"{prefix}test-{uuid.uuid4().hex[:6]}"
    async with Worker(client, task_queue=queue, workflows=[OneReset]):
        return await asyncio.wait_for(
            client.execute_workflow(
                OneReset.run,
                f"{prefix}cpu",
                id=f"one-reset-{uuid.uuid4().hex[:8]}",
                task_queue=queue,
                result_type=EnvHandle,
            ),
            timeout_s,
        )


@pytest.mark.integration
def test_a_worker_started_before_its_server_waits_then_serves(tmp_path: Path) -> None:
    port = free_port()
    worker = _cpu_worker(f"127.0.0.1:{port}", tmp_path, "early-")
    try:
        worker.wait_for(f"waiting for Temporal at 127.0.0.1:{port} (attempt 1): connection refused", 30)
        worker.wait_for("(attempt 3)", 10)  # still waiting, backing off
        with DevServer(db_file=tmp_path / "t.db", port=port, ui_port=None) as server:
            up = time.monotonic()
            ready_after = worker.wait_for("ready: pool=cpu", 30)
            handle = asyncio.run(_one_reset(server.address, tmp_path, "early-"))
            served_after = time.monotonic() - up
            assert handle.worker_id.startswith("cpu-") and "move:" in handle.observation
            print(f"server up -> worker ready {ready_after:.1f}s, -> reset served {served_after:.1f}s")
        assert worker.proc.poll() is None  # still serving, not crashed
    finally:
        worker.stop()


@pytest.mark.integration
def test_sigterm_stops_a_worker_still_waiting_for_its_server(tmp_path: Path) -> None:
    worker = _cpu_worker(f"127.0.0.1:{free_port()}", tmp_path, "term-")
    try:
        worker.wait_for("waiting for Temporal at", 30)
        t0 = time.monotonic()
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.proc.wait(10) == 0
        worker.wait_for("stopped while waiting for Temporal", 2)
        assert time.monotonic() - t0 < 3
    finally:
        worker.stop()


@pytest.mark.integration
def test_the_autoscaler_waits_for_its_server_and_stops_on_sigterm(tmp_path: Path) -> None:
    scaler = Lines(
        [
            *ROLLART,
            "autoscale",
            "--min",
            "0",
            "--max",
            "1",
            "--temporal-address",
            f"127.0.0.1:{free_port()}",
            "--store-path",
            str(tmp_path / "store"),
            "--home",
            str(tmp_path),
        ]
    )
    try:
        scaler.wait_for("waiting for Temporal at 127.0.0.1:", 30)
        scaler.proc.send_signal(signal.SIGTERM)
        assert scaler.proc.wait(10) == 0, scaler.text
    finally:
        scaler.stop()


@pytest.mark.integration
def test_a_worker_waits_for_its_mooncake_master(tmp_path: Path) -> None:
    from rollart.infra.local.mooncake_service import MooncakeService

    store = StoreConfig(kind="mooncake", path=tmp_path / "store", mooncake={"keeper_segment_mib": 64})
    mooncake = MooncakeService(store, log_dir=tmp_path / "logs")
    with DevServer(db_file=tmp_path / "t.db", port=free_port(), ui_port=None) as server:
        worker = _cpu_worker(server.address, tmp_path / "store", "mc-", "--store-master", mooncake.address)
        try:
            worker.wait_for(f"waiting for the Mooncake master at {mooncake.address} (attempt 2)", 30)
            mooncake.start()
            ready_after = worker.wait_for("ready: pool=cpu", 30)
            print(f"master up -> worker ready {ready_after:.1f}s")
            handle = asyncio.run(_one_reset(server.address, tmp_path / "store", "mc-"))
            assert handle.worker_id.startswith("cpu-")
        finally:
            worker.stop()
            mooncake.stop()


@pytest.mark.integration
@pytest.mark.chaos  # a kill or a server restart
def test_a_worker_keeps_serving_across_a_server_restart(tmp_path: Path) -> None:
    server = DevServer(db_file=tmp_path / "t.db", port=free_port(), ui_port=None).start()
    worker = _cpu_worker(server.address, tmp_path, "restart-")
    try:
        worker.wait_for("ready: pool=cpu", 60)
        first = asyncio.run(_one_reset(server.address, tmp_path, "restart-"))
        server.stop()
        time.sleep(3)  # down long enough for the worker's polls to fail
        server.start()
        up = time.monotonic()
        second = asyncio.run(_one_reset(server.address, tmp_path, "restart-", timeout_s=45))
        print(f"server back -> reset served {time.monotonic() - up:.1f}s")
        assert second.worker_id == first.worker_id  # the same worker process, not a replacement
        assert worker.proc.poll() is None
    finally:
        worker.stop()
        server.stop()


@pytest.mark.integration
def test_a_namespace_the_server_lacks_fails_at_once_naming_it(tmp_path: Path) -> None:
    with DevServer(db_file=tmp_path / "t.db", port=free_port(), ui_port=None) as server:
        t0 = time.monotonic()
        done = subprocess.run(
            [
                *ROLLART,
                "worker",
                "--pool",
                "cpu",
                "--temporal-address",
                server.address,
                "--namespace",
                "no-such-ns",
                "--store-path",
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=60,
        )
        assert done.returncode == 2, done.stderr
        assert "no namespace 'no-such-ns'" in done.stderr and "waiting for" not in done.stderr
        assert time.monotonic() - t0 < 20


@pytest.mark.parametrize(
    "address, expected", [("nosuchhost.invalid:7233", "cannot resolve the host"), ("127.0.0.1", "expected HOST:PORT")]
)
def test_a_bad_address_fails_at_once(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, address: str, expected: str
) -> None:
    done = rollart(capsys, "worker", "--pool", "cpu", "--temporal-address", address, "--store-path", str(tmp_path))
    assert done.returncode == 2 and expected in done.stderr, done.stderr
    assert "waiting for" not in done.stderr


def test_connect_timeout_gives_up_with_a_clear_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    t0 = time.monotonic()
    address = f"127.0.0.1:{free_port()}"
    done = rollart(
        capsys,
        "worker",
        "--pool",
        "cpu",
        "--temporal-address",
        address,
        "--store-path",
        str(tmp_path),
        "--connect-timeout",
        "2",
    )
    elapsed = time.monotonic() - t0
    assert done.returncode == 1, done.stderr
    assert "gave up waiting for Temporal at 127.0.0.1:" in done.stderr and "limit 2s" in done.stderr
    assert elapsed < 30, elapsed  # 2 s of waiting, not the default's minutes
    print(f"--connect-timeout 2: gave up after {elapsed:.1f}s")


@pytest.mark.integration
def test_a_leftover_engine_of_a_dead_worker_is_found_and_reclaimed(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()  # a worker pid that no longer runs
    model = tmp_path / "model"
    mark = f"h800|{gone.pid}|{model.resolve()}"
    env = {**os.environ, lifeline.ENGINE_MARK_ENV: mark}
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    other = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**env, lifeline.ENGINE_MARK_ENV: f"h800|{gone.pid}|/elsewhere"},
    )
    try:
        deadline = time.monotonic() + 10
        while {orphan.pid, other.pid} - {left.pid for left in lifeline.leftover_engines("h800")}:
            assert time.monotonic() < deadline, lifeline.leftover_engines("h800")
            time.sleep(0.1)
        assert not [left for left in lifeline.leftover_engines("h20") if left.pid in (orphan.pid, other.pid)]
        found = [left for left in lifeline.leftover_engines("h800") if left.pid in (orphan.pid, other.pid)]
        killed = lifeline.reclaim(found, model)
        assert [k.pid for k in killed] == [orphan.pid]  # the other model dir's engine is only reported
        assert orphan.wait(10) == -signal.SIGKILL and other.poll() is None
    finally:
        for p in (orphan, other):
            p.kill()
            p.wait()


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["hooked", "plain"])
@pytest.mark.chaos  # a kill or a server restart
def test_a_forked_child_dies_with_its_sigkilled_parent_only_when_hooked(mode: str) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-m", "tests.support.fork_parent", mode], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    assert parent.stdout is not None
    child = psutil.Process(int(parent.stdout.readline()))
    try:
        parent.kill()
        parent.wait()
        try:
            child.wait(3)
            died = True
        except psutil.TimeoutExpired:
            died = False
        assert died is (mode == "hooked")  # without the hook a fork child outlives its SIGKILLed parent
    finally:
        with contextlib.suppress(psutil.Error):
            child.kill()


@pytest.mark.integration
@pytest.mark.chaos  # a kill or a server restart
def test_a_worker_started_by_a_stack_drains_and_exits_when_the_stack_is_killed(tmp_path: Path) -> None:
    stack = subprocess.Popen(
        [sys.executable, "-m", "tests.support.spawn_parent", str(tmp_path), f"127.0.0.1:{free_port()}"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert stack.stdout is not None
    worker = psutil.Process(int(stack.stdout.readline()))
    try:
        log = tmp_path / "logs" / "worker-cpu-0.log"
        deadline = time.monotonic() + 30
        while "waiting for Temporal" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline, log.read_text() if log.exists() else "no log"
            time.sleep(0.1)
        stack.kill()
        stack.wait()
        t0 = time.monotonic()
        worker.wait(5)  # not our child: psutil raises TimeoutExpired if it is still there
        print(f"worker exited {time.monotonic() - t0:.2f}s after its stack was SIGKILLed")
        assert "stopped while waiting for Temporal" in log.read_text()  # SIGTERM from the kernel: a clean stop
    finally:
        with contextlib.suppress(psutil.Error):
            worker.kill()
        stack.kill()
        stack.wait()


@pytest.mark.integration
@pytest.mark.chaos  # a kill or a server restart
def test_the_server_and_mooncake_processes_of_a_killed_stack_go_with_it(tmp_path: Path) -> None:
    stack = subprocess.Popen(
        [sys.executable, "-m", "tests.support.server_parent", str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert stack.stdout is not None
    children = [psutil.Process(int(pid)) for pid in stack.stdout.readline().split()]
    try:
        assert len(children) == 3
        assert [c.name() for c in children] == ["temporal", "mooncake_master", "mooncake_client"]  # exec kept the pid
        stack.kill()
        stack.wait()
        t0 = time.monotonic()
        _gone, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, f"outlived their SIGKILLed stack: {alive}"
        print(f"dev server, Mooncake master and keeper gone {time.monotonic() - t0:.2f}s after the stack was killed")
    finally:
        for c in children:
            with contextlib.suppress(psutil.Error):
                c.kill()
        stack.kill()
        stack.wait()


@pytest.mark.integration
@pytest.mark.chaos  # a kill or a server restart
def test_a_sigkilled_rollart_up_leaves_nothing_running(tmp_path: Path) -> None:
    up = Lines(
        [
            *ROLLART,
            "up",
            "--pools",
            "control,cpu,serverless",
            "--home",
            str(tmp_path),
            "--port",
            str(free_port()),
            "--ui-port",
            str(free_port()),
        ]
    )
    family: list[psutil.Process] = []
    try:
        up.wait_for("Ctrl-C stops everything", 120)
        family = psutil.Process(up.proc.pid).children(recursive=True)
        names = sorted(p.name() for p in family)
        assert "temporal" in names and len(family) >= 3, names  # the server, the control and cpu workers, ...
        up.proc.kill()
        up.proc.wait()
        t0 = time.monotonic()
        _, alive = psutil.wait_procs(family, timeout=20)
        assert not alive, f"outlived their SIGKILLed `rollart up`: {alive}"
        print(f"{names} of a SIGKILLed `rollart up` gone after {time.monotonic() - t0:.2f}s")
    finally:
        up.stop()
        for p in family:
            with contextlib.suppress(psutil.Error):
                p.kill()


@pytest.mark.chaos
def test_a_sigkilled_generation_worker_leaves_no_process(tmp_path: Path, tiny_model: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()  # what a killed worker of an older version left: an engine whose worker is dead
    mark = f"h800|{gone.pid}|{tiny_model.resolve()}"
    leftover = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], env={**os.environ, lifeline.ENGINE_MARK_ENV: mark}
    )
    with DevServer(db_file=tmp_path / "t.db", port=free_port(), ui_port=None) as server:
        worker = Lines(
            [
                *ROLLART,
                "worker",
                "--pool",
                "h800",
                "--engine",
                "vllm",
                "--model-dir",
                str(tiny_model),
                "--temporal-address",
                server.address,
                "--store-path",
                str(tmp_path),
                "--task-queue-prefix",
                "kill-",
            ]
        )
        family: list[psutil.Process] = []
        try:
            worker.wait_for("ready: pool=h800", 180)
            assert f"leftover h800 engine of dead worker pid {gone.pid}: pid {leftover.pid}," in worker.text
            assert leftover.wait(5) == -signal.SIGKILL  # same user, same model dir, worker dead: reclaimed
            family = psutil.Process(worker.proc.pid).children(recursive=True)
            assert family, "the vLLM engine runs in a child process"
            print("worker children:", [(p.pid, p.name()) for p in family])
            os.kill(worker.proc.pid, signal.SIGKILL)
            worker.proc.wait()
            t0 = time.monotonic()
            while alive := [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]:
                assert time.monotonic() - t0 < 10, f"outlived their SIGKILLed worker: {alive}"
                time.sleep(0.05)
            print(f"every child of the SIGKILLed worker gone after {time.monotonic() - t0:.2f}s")
        finally:
            worker.stop()
            leftover.kill()
            leftover.wait()
            for p in family:
                with contextlib.suppress(psutil.Error):
                    p.kill()
