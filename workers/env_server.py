"""An env server process: a rollart env served as an OpenEnv environment over HTTP/WebSocket (uvicorn).

`rollart env-server --env frozenlake --port 8300` runs it; the local stack starts one per entry of a job's
`env_servers` (and restarts it when it dies: `EnvServerProcesses`), Kubernetes runs each as a Deployment
behind a Service. Clients are `openenv` envs (activities/envs/openenv_client.py) in the cpu workers: one
WebSocket session per episode. A server that dies takes its sessions with it; the episodes are restored
on a fresh session by replay, so the server itself keeps no state worth saving.

Exposure: the local stack binds each server to loopback, and every server serves only clients that present the
job's token (`infra.env_server_token`: `$ROLLART_ENV_SERVER_TOKEN`, minted once per local stack by
`env_server_token`, inherited by the workers and servers it starts; on Kubernetes the file
`$ROLLART_ENV_SERVER_TOKEN_FILE` names, the job's Secret). `/health` is open. A token file that is named but
missing or empty stops the server before it listens: it never falls back to serving everyone.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollart.spec.config import EnvServerSpec

__all__ = ["EnvServerError", "EnvServerProcesses", "env_server_token", "serve", "wait_healthy"]

log = logging.getLogger(__name__)

HEALTH_PATH = "/health"
_WATCH_EVERY_S = 0.2


class EnvServerError(RuntimeError):
    """An env server of the local stack exited or never became healthy."""


def env_server_token() -> str:
    """The job's env-server token: the one already given (`job_token`: a token file, or `$ROLLART_ENV_SERVER_TOKEN`,
    a user's), else one minted now and put in this process's environment, so the workers and env servers it starts
    afterwards inherit it."""
    from rollart.infra.env_server_token import TOKEN_ENV, job_token

    token = job_token()
    if not token:
        token = os.environ[TOKEN_ENV] = secrets.token_urlsafe(32)
    return token


def serve(
    env: str, env_args: dict[str, Any], host: str, port: int, max_sessions: int, parent_pid: int | None = None
) -> None:
    """Serve `env` on host:port until SIGTERM/Ctrl-C; with `parent_pid`, also until that process dies. With a
    job token (`job_token`), only clients presenting it are served; EnvTokenError, before listening, when
    `$ROLLART_ENV_SERVER_TOKEN_FILE` names a file without one."""
    import uvicorn

    from rollart.activities.envs.openenv_server import openenv_app
    from rollart.infra.env_server_token import job_token

    token = job_token()  # a named token file must hold one: never serve everyone by mistake
    if token is None and not _is_loopback(host):
        log.warning("env server on %s:%d has no token: it serves everyone who can reach it", host, port)
    if parent_pid is not None:  # started by a local stack: stop with it
        from rollart.infra.local.parent_death import die_with_parent

        die_with_parent(parent_pid, signal.SIGTERM)
    app = openenv_app(env, env_args, max_sessions=max_sessions, token=token)
    # Sessions are WebSockets: no ping timeout (a long step must not close its session), the server's own
    # process lifetime bounds them.
    uvicorn.run(app, host=host, port=port, log_level="warning", ws_ping_interval=None, ws_ping_timeout=None)


def _is_loopback(host: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def wait_healthy(
    url: str, timeout_s: float, proc: subprocess.Popen | None = None, log_file: Path | None = None
) -> float:
    """Wait until `url`'s health endpoint answers 200; the seconds it took. Raises if `proc` exits first."""
    t0 = time.monotonic()
    while True:
        try:
            with urllib.request.urlopen(url.rstrip("/") + HEALTH_PATH, timeout=2) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except (urllib.error.URLError, OSError):
            pass
        if proc is not None and proc.poll() is not None:
            raise EnvServerError(f"env server at {url} exited with code {proc.returncode}{_tail(log_file)}")
        if time.monotonic() - t0 > timeout_s:
            raise EnvServerError(f"env server at {url} not healthy after {timeout_s:g}s{_tail(log_file)}")
        time.sleep(0.1)


@dataclass
class _Server:
    spec: EnvServerSpec
    log_file: Path
    proc: subprocess.Popen | None = None
    restarts: list[float] = field(default_factory=list)  # seconds from death seen to healthy again, per restart


@dataclass
class EnvServerProcesses:
    """The local stack's env servers: started, watched (a dead one is restarted on its port), stopped.

    `start()` returns once every server answers its health check. A watcher thread restarts a server
    that exits without being asked to (the sessions it held are restored by the workflows, by replay);
    it lives until `stop()`, so the servers it starts die with this process (parent-death signal).
    """

    specs: list[EnvServerSpec]
    logs: Path
    ready_timeout_s: float = 120.0
    _servers: list[_Server] = field(default_factory=list, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)

    def start(self) -> EnvServerProcesses:
        env_server_token()  # the local stack minted it before its workers: the same one
        self.logs.mkdir(parents=True, exist_ok=True)
        self._servers = [_Server(spec, self.logs / f"env-server-{spec.name}.log") for spec in self.specs]
        try:
            for s in self._servers:
                self._spawn(s)
            for s in self._servers:
                took = wait_healthy(s.spec.local_url, self.ready_timeout_s, s.proc, s.log_file)
                log.info(
                    "env server %s (%s) healthy at %s after %.1fs", s.spec.name, s.spec.env, s.spec.local_url, took
                )
        except BaseException:
            self.stop()
            raise
        if self._servers:
            self._thread = threading.Thread(target=self._watch, name="env-servers", daemon=True)
            self._thread.start()
        return self

    def pids(self) -> dict[str, int]:
        """The running servers' PIDs by name."""
        with self._lock:
            return {s.spec.name: s.proc.pid for s in self._servers if s.proc is not None and s.proc.poll() is None}

    def restarts(self, name: str) -> list[float]:
        """For each restart of server `name` so far: seconds from its death being seen to its health check passing."""
        return list(self._server(name).restarts)

    def kill(self, name: str) -> int:
        """SIGKILL server `name` (chaos); the watcher restarts it. Returns the killed PID."""
        with self._lock:
            proc = self._server(name).proc
            if proc is None:
                raise ValueError(f"env server {name!r} is not running")
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        log.info("killed env server %s (pid %d)", name, proc.pid)
        return proc.pid

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop watching, then SIGTERM every server (SIGKILL after `timeout_s`)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        with self._lock:
            for s in self._servers:
                if s.proc is not None and s.proc.poll() is None:
                    s.proc.send_signal(signal.SIGTERM)
            for s in self._servers:
                if s.proc is None:
                    continue
                try:
                    s.proc.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    s.proc.kill()
                    s.proc.wait()

    def _server(self, name: str) -> _Server:
        for s in self._servers:
            if s.spec.name == name:
                return s
        raise ValueError(f"no env server {name!r}; servers: {', '.join(s.spec.name for s in self._servers)}")

    def _spawn(self, s: _Server) -> None:
        cmd = [sys.executable, "-m", "rollart.cli", *s.spec.command("127.0.0.1")[1:], "--parent-pid", str(os.getpid())]
        with open(s.log_file, "ab") as out:
            s.proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        log.info("started env server %s (pid %d) on port %d, log: %s", s.spec.name, s.proc.pid, s.spec.port, s.log_file)

    def _watch(self) -> None:
        while not self._stop.wait(_WATCH_EVERY_S):
            for s in self._servers:
                with self._lock:
                    if self._stop.is_set() or s.proc is None or s.proc.poll() is None:
                        continue
                    seen = time.monotonic()
                    log.warning(
                        "env server %s (pid %d) exited with code %s: restarting it on port %d",
                        s.spec.name,
                        s.proc.pid,
                        s.proc.returncode,
                        s.spec.port,
                    )
                    self._spawn(s)
                try:
                    wait_healthy(s.spec.local_url, self.ready_timeout_s, s.proc, s.log_file)
                except EnvServerError as e:
                    log.error("restarting env server %s failed: %s", s.spec.name, e)
                    continue
                s.restarts.append(time.monotonic() - seen)
                log.info(
                    "env server %s healthy again %.1fs after it died (pid %d)", s.spec.name, s.restarts[-1], s.proc.pid
                )


def _tail(path: Path | None, lines: int = 15) -> str:
    if path is None:
        return ""
    try:
        return ":\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
