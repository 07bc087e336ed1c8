"""The embedded default: a local Temporal dev server plus one worker process per pool, on this machine.

Used by `rollart up` (until Ctrl-C) and by `rollart rollout` when no server
is given. Workers are separate processes, exactly as on a cluster; each gets
its settings as a JSON file and signals readiness by writing a ready file.
With `store: {kind: mooncake}` and no master address, the stack also starts a
Mooncake master and store keeper (infra/local/mooncake_service.py) and points every
worker at them; they stop after the workers. The job's `env_servers` run as
processes of their own (workers/env_server.py), restarted when they die.
Which workers start follows the job's declared pools (`JobSpec.pools`): each
pool's role says what its workers serve. Elastic (reward) pools such as
"serverless" are run by an autoscaler (between the job's
`pools.<pool>.min_workers` and `max_workers`) unless `autoscale=False`.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rollart.infra.env_server_token import EnvTokenError
from rollart.infra.local.devserver import DevServer
from rollart.infra.temporal.search_attributes import dev_server_flags
from rollart.spec.config import DEFAULT_HOME, JobSpec, StoreConfig, TemporalConfig
from rollart.spec.pools import Pool
from rollart.workers.autoscaler import Autoscaler, WorkerProcesses, spawn_worker
from rollart.workers.env_server import EnvServerError, EnvServerProcesses, env_server_token
from rollart.workers.settings import WorkerSettings

if TYPE_CHECKING:
    from rollart.infra.local.mooncake_service import MooncakeService

__all__ = ["LocalStack", "StackError", "pools_for_job"]

log = logging.getLogger(__name__)


class StackError(RuntimeError):
    """A worker of the local stack died or never became ready."""


def pools_for_job(job: JobSpec, training: bool = False) -> list[str]:
    """The pools a job needs a worker for: control, cpu and the env pools its tasks use, the generation pools
    they use, the reward pools their rewards go to (+ trainer).

    A generation pool is used by a task's generation, or by an env or reward placed there. A reward pool
    (serverless) only when some task's reward runs there (not every reward is `colocated`).
    """
    used = {t.env_queue for t in job.tasks} | {t.reward_queue for t in job.tasks}
    envs = [p for p, spec in job.pools.items() if spec.role == "env" and p in used and p != Pool.CPU]
    gen = sorted(job.needs().generate_pools)
    rewards = [p for p, spec in job.pools.items() if spec.role == "reward" and p in used]
    return [Pool.CONTROL.value, Pool.CPU.value, *envs, *gen, *rewards, *([Pool.TRAINER.value] if training else [])]


@dataclass
class _WorkerProc:
    pool: str
    proc: subprocess.Popen
    log_file: Path
    ready_file: Path


@dataclass
class LocalStack:
    """Dev server + workers; `start()` returns when every worker polls its queue.

    `pools`: a worker process per entry (a pool twice: two workers); default one per pool the job declares.
    """

    job: JobSpec
    pools: list[str] = field(default_factory=list)
    home: Path = DEFAULT_HOME
    port: int = 7233
    ui_port: int | None = 8233
    autoscale: bool = True
    server: DevServer | None = field(default=None, init=False)
    mooncake: MooncakeService | None = field(default=None, init=False)
    env_servers: EnvServerProcesses | None = field(default=None, init=False)
    _workers: list[_WorkerProc] = field(default_factory=list, init=False)
    _scalers: list[Autoscaler] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.pools = self.pools or list(self.job.pools)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ui_url(self) -> str | None:
        return self.server.ui_url if self.server else None

    @property
    def temporal(self) -> TemporalConfig:
        """The job's Temporal section pointed at this stack's server (plain gRPC: the dev server has no TLS)."""
        return self.job.temporal.without_security().model_copy(update={"address": self.address})

    @property
    def store(self) -> StoreConfig:
        """The job's store section, pointed at this stack's Mooncake master when it started one."""
        return self.mooncake.config if self.mooncake else self.job.store

    def worker_pids(self) -> dict[str, int]:
        pids: dict[str, int] = {}
        numbered: Counter[str] = Counter()  # within their pool: control#0, control#1, cpu#0
        for w in self._workers:
            pids[f"{w.pool}#{numbered[w.pool]}"] = w.proc.pid
            numbered[w.pool] += 1
        for scaler in self._scalers:
            pids |= {f"{scaler.queue}#{i} (elastic)": pid for i, pid in enumerate(scaler.procs.pids())}
        return pids

    def autoscaler(self, pool: str = Pool.SERVERLESS.value) -> Autoscaler | None:
        """The autoscaler running `pool`'s workers, if any."""
        return next((s for s in self._scalers if s.procs.settings.pool == pool), None)

    def live_workers(self, pool: str) -> list[int]:
        """PIDs of the running worker processes of `pool`, oldest first."""
        return [w.proc.pid for w in self._workers if w.pool == pool and w.proc.poll() is None]

    def add_worker(self, pool: str, timeout_s: float = 300.0) -> int:
        """Start one more worker process for `pool` (it polls the same queue) and wait until it is ready."""
        w = self._spawn(pool, self.home / "logs")
        self._wait_ready(timeout_s, [w])
        return w.proc.pid

    def worker_id(self, pid: int) -> str:
        """The worker id of this stack's worker `pid` (its Temporal identity; `h800@<id>` is its private queue)."""
        w = self._worker(pid)
        if not w.ready_file.exists():
            raise StackError(f"{w.pool} worker (pid {pid}) is not ready: it has no worker id yet")
        return w.ready_file.read_text().strip()

    def stop_worker(self, pid: int, timeout_s: float = 60.0) -> None:
        """SIGTERM one of this stack's worker processes and wait for it: it drains what it holds, then exits."""
        w = self._worker(pid)
        w.proc.send_signal(signal.SIGTERM)
        try:
            w.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("worker %s (pid %d) did not drain in time; killing it", w.pool, pid)
            w.proc.kill()
            w.proc.wait()
        log.info("stopped %s worker (pid %d)", w.pool, pid)

    def _worker(self, pid: int) -> _WorkerProc:
        w = next((w for w in self._workers if w.proc.pid == pid), None)
        if w is None:
            raise ValueError(f"pid {pid} is not a worker of this stack: {self.worker_pids()}")
        return w

    def kill_worker(self, pid: int) -> None:
        """SIGKILL one of this stack's worker processes (chaos): no drain, its in-flight work is simply lost."""
        w = self._worker(pid)
        w.proc.send_signal(signal.SIGKILL)
        w.proc.wait()
        log.info("killed %s worker (pid %d)", w.pool, pid)

    def restart_server(self, down_s: float = 0.0) -> None:
        """Stop the Temporal dev server, stay down `down_s`, start it again on the same database file.

        Workers keep running and reconnect by themselves; every workflow resumes from its history.
        """
        if self.server is None:
            raise StackError("the stack has no server to restart; call start() first")
        self.server.stop()
        time.sleep(down_s)
        self.server.start()

    def start(self, timeout_s: float = 300.0) -> LocalStack:
        """Start the server, then the workers; wait for all of them. Cleans up on failure."""
        logs = self.home / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.server = DevServer(
            db_file=self.home / "temporal.db",
            port=self.port,
            ui_port=self.ui_port,
            namespace=self.job.temporal.namespace,
            log_file=logs / "temporal.log",
            search_attributes=dev_server_flags(),
            max_pending_children=self.job.temporal.max_pending_children,
            limits=self.job.temporal.limits,
        ).start()
        try:
            store = self.job.store
            if store.kind == "mooncake" and store.mooncake.master is None:
                from rollart.infra.local.mooncake_service import MooncakeService

                self.mooncake = MooncakeService(store, log_dir=logs).start()
            if self.job.env_servers:  # one token for the job, before its workers and servers start (they inherit it)
                try:
                    env_server_token()
                except EnvTokenError as e:
                    raise StackError(str(e)) from e
            for pool in self.pools:
                if not self._elastic(pool):
                    self._spawn(pool, logs)
            for pool in dict.fromkeys(self.pools):
                if self._elastic(pool):
                    self._start_autoscaler(pool, timeout_s)
            if self.job.env_servers:  # while the workers start
                try:
                    self.env_servers = EnvServerProcesses(self.job.env_servers, logs, ready_timeout_s=timeout_s).start()
                except EnvServerError as e:
                    raise StackError(str(e)) from e
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGTERM every worker (they drain in-flight work), then the server; SIGKILL stragglers."""
        for scaler in self._scalers:
            scaler.stop_thread(timeout_s)
        self._scalers.clear()
        for w in self._workers:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for w in self._workers:
            try:
                w.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker %s (pid %d) did not drain in time; killing it", w.pool, w.proc.pid)
                w.proc.kill()
                w.proc.wait()
        self._workers.clear()
        if self.env_servers:
            self.env_servers.stop()
        if self.mooncake:
            self.mooncake.stop()
        if self.server:
            self.server.stop()

    def _elastic(self, pool: str) -> bool:
        """Whether `pool`'s workers are the autoscaler's to start: a reward pool, when this stack autoscales."""
        spec = self.job.pools.get(pool)
        return self.autoscale and spec is not None and spec.role == "reward"

    def _start_autoscaler(self, pool: str, timeout_s: float) -> None:
        settings = WorkerSettings.from_job(self.job, pool, temporal=self.temporal, store=self.store)
        scaler = Autoscaler(cfg=self.job.elastic(pool), procs=WorkerProcesses(settings, self.home))
        self._scalers.append(scaler)
        try:
            scaler.start_in_thread(ready_timeout_s=timeout_s)
        except RuntimeError as e:
            raise StackError(f"{pool} pool: {e}") from e
        log.info("autoscaling %s: %d..%d workers", pool, scaler.cfg.min_workers, scaler.cfg.max_workers)

    def _spawn(self, pool: str, logs: Path) -> _WorkerProc:
        n = sum(1 for w in self._workers if w.pool == pool)
        settings = WorkerSettings.from_job(self.job, pool, temporal=self.temporal, store=self.store)
        p = spawn_worker(settings, f"{pool}-{n}", logs.parent)
        w = _WorkerProc(pool=pool, proc=p.proc, log_file=p.log_file, ready_file=p.ready_file)
        self._workers.append(w)
        log.info("started %s worker (pid %d), log: %s", pool, p.proc.pid, p.log_file)
        return w

    def _wait_ready(self, timeout_s: float, workers: list[_WorkerProc] | None = None) -> None:
        deadline = time.monotonic() + timeout_s
        pending = list(self._workers if workers is None else workers)
        while pending:
            for w in list(pending):
                if w.ready_file.exists():
                    pending.remove(w)
                elif w.proc.poll() is not None:
                    raise StackError(f"{w.pool} worker exited with code {w.proc.returncode}:\n{_tail(w.log_file)}")
            if time.monotonic() > deadline:
                names = ", ".join(w.pool for w in pending)
                raise StackError(f"workers not ready after {timeout_s:g}s: {names} (logs in {self.home / 'logs'})")
            time.sleep(0.2)

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"
