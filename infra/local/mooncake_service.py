"""Mooncake Store's server side for the local stack: a `mooncake_master` and a store keeper, on loopback.

The master holds the index of every object; the keeper (Mooncake's own
`mooncake_client`, a standalone client) lends the memory objects live in — its
*global segment*. Rollart's workers lend none by default, so a worker that
exits or crashes takes no data with it. Failure modes: the master dies → every
key is forgotten (clients reconnect when it is back); the keeper dies → the
objects in its segment are gone. With `store.fallback: local` the local copy
serves reads in both cases.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rollart.infra.local.devserver import free_port
from rollart.infra.local.parent_death import guarded
from rollart.infra.store.mooncake import mooncake_env
from rollart.infra.store.payload import StoreError
from rollart.spec.config import StoreConfig

__all__ = ["MooncakeService", "mooncake_binary"]

log = logging.getLogger(__name__)


def mooncake_binary(name: str) -> str:
    """Path of a binary shipped in the mooncake wheel (`mooncake_master`, `mooncake_client`)."""
    try:
        import mooncake
    except ImportError as e:  # e.g. libibverbs.so.1 missing
        raise StoreError(f"cannot import mooncake ({e}); `make setup` installs it and Debian's libibverbs1") from e
    path = Path(mooncake.__file__).parent / name
    if not path.is_file():
        raise StoreError(f"{name} not found in the mooncake package at {path.parent}")
    return str(path)


@dataclass
class MooncakeService:
    """A master and a keeper on free loopback ports; `start()` returns once both serve, `stop()` ends them by PID."""

    store: StoreConfig
    log_dir: Path
    rpc_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    keeper_port: int = field(default_factory=free_port)
    master_proc: subprocess.Popen | None = field(default=None, init=False)
    keeper_proc: subprocess.Popen | None = field(default=None, init=False)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.rpc_port}"

    @property
    def config(self) -> StoreConfig:
        """The store config pointed at this master (what workers and clients get)."""
        return self.store.with_master(self.address)

    def start(self, timeout_s: float = 30.0) -> MooncakeService:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.start_master(timeout_s)
            self._start_keeper(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def start_master(self, timeout_s: float = 30.0) -> None:
        """Start (or restart, on the same ports) the master and wait for its health endpoint."""
        cmd = [
            mooncake_binary("mooncake_master"),
            "--rpc_address=127.0.0.1",
            f"--rpc_port={self.rpc_port}",
            "--metrics_host=127.0.0.1",
            f"--metrics_port={self.metrics_port}",
            f"--default_kv_lease_ttl={round(self.store.mooncake.lease_s * 1000)}",
            "--minloglevel=2",
        ]
        self.master_proc = self._spawn(cmd, "mooncake-master.log")
        self._wait_until(self._healthy, self.master_proc, "mooncake_master", "mooncake-master.log", timeout_s)
        log.info("Mooncake master on %s (pid %d)", self.address, self.master_proc.pid)

    def _start_keeper(self, timeout_s: float) -> None:
        mc = self.store.mooncake
        cmd = [
            mooncake_binary("mooncake_client"),
            f"--host={mc.host}",
            f"--port={self.keeper_port}",
            "--metadata_server=P2PHANDSHAKE",
            f"--global_segment_size={mc.keeper_segment_mib}MB",
            f"--master_server_address={self.address}",
            f"--protocol={mc.protocol}",
            f"--device_names={mc.rdma_devices}",
            "--minloglevel=2",
        ]
        self.keeper_proc = self._spawn(cmd, "mooncake-keeper.log")
        # the keeper's RPC port opens once its segment is mounted
        self._wait_until(
            self._keeper_listening, self.keeper_proc, "the Mooncake store keeper", "mooncake-keeper.log", timeout_s
        )
        log.info("Mooncake store keeper (pid %d): %d MiB segment", self.keeper_proc.pid, mc.keeper_segment_mib)

    def kill_master(self) -> None:
        """SIGKILL the master (fault injection: every key it indexed is forgotten)."""
        if self.master_proc and self.master_proc.poll() is None:
            self.master_proc.kill()
            self.master_proc.wait()

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM the keeper, then the master (by PID); SIGKILL if they linger."""
        for proc in (self.keeper_proc, self.master_proc):
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _spawn(self, cmd: list[str], log_name: str) -> subprocess.Popen:
        with open(self.log_dir / log_name, "ab") as out:
            env = {**os.environ, **mooncake_env()}  # its own session, but it dies with the stack (parent_death)
            return subprocess.Popen(guarded(cmd), stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def _wait_until(
        self, ready: Callable[[], bool], proc: subprocess.Popen, what: str, log_name: str, timeout_s: float
    ) -> None:
        """Poll `ready` until it holds; a process that exits or a timeout is a StoreError naming its log."""
        deadline = time.monotonic() + timeout_s
        while not ready():
            if proc.poll() is not None:
                raise StoreError(f"{what} exited with code {proc.returncode}; see {self.log_dir / log_name}")
            if time.monotonic() > deadline:
                raise StoreError(
                    f"{what} not ready after {timeout_s:g}s on {self.address}; see {self.log_dir / log_name}"
                )
            time.sleep(0.05)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/health", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def _keeper_listening(self) -> bool:
        import socket

        with socket.socket() as s:
            s.settimeout(0.2)
            return s.connect_ex(("127.0.0.1", self.keeper_port)) == 0

    def __enter__(self) -> MooncakeService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
