"""The local autoscaler of an elastic pool: reads the queue's backlog from Temporal, starts and stops workers.

Every `poll_interval_s` it asks Temporal for the pool's activity backlog, lets `scaling.decide`
pick a worker count, and makes the local `rollart worker --pool serverless` processes match it:
new ones are started, surplus ones get SIGTERM and drain what they hold before they exit, and
one that died (killed, crashed) is replaced at once. Every decision that changes the count, and
every worker that starts, becomes ready or exits, is logged with the backlog seen.

`rollart up` runs one in a background thread (`start_in_thread`); `rollart autoscale` runs it
alone against any server. On a cluster the same signal drives KEDA's Temporal scaler.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from rollart.infra.temporal.backlog import QueueStats, queue_stats
from rollart.infra.temporal.connection import connect
from rollart.infra.waiting import Backoff, unless_stopped
from rollart.spec.pools import ElasticPoolConfig, queue_name
from rollart.workers.scaling import ScaleDecision, ScaleState, decide
from rollart.workers.settings import WorkerSettings

__all__ = ["Autoscaler", "ScaleEvent", "WorkerProcess", "WorkerProcesses", "spawn_worker"]

log = logging.getLogger("rollart.autoscaler")


@dataclass
class WorkerProcess:
    """One local worker process: `rollart worker --settings-file`, ready once it has written its ready file."""

    name: str
    proc: subprocess.Popen
    log_file: Path
    ready_file: Path
    started_at: float
    ready_at: float | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll_ready(self) -> bool:
        if self.ready_at is None and self.ready_file.exists():
            self.ready_at = time.monotonic()
        return self.ready_at is not None


def spawn_worker(settings: WorkerSettings, name: str, home: Path) -> WorkerProcess:
    """Start a worker process for `settings`; its settings, ready file and log live under `home`."""
    run, logs = home / "run", home / "logs"
    run.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    ready = run / f"{name}.ready"
    ready.unlink(missing_ok=True)
    settings = settings.model_copy(update={"ready_file": ready, "parent_pid": os.getpid()})  # it dies with us
    settings_file = run / f"{name}.json"
    settings_file.write_text(settings.model_dump_json(indent=2))
    log_file = logs / f"worker-{name}.log"
    cmd = [sys.executable, "-m", "rollart.cli", "worker", "--settings-file", str(settings_file)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return WorkerProcess(name=name, proc=proc, log_file=log_file, ready_file=ready, started_at=time.monotonic())


@dataclass(frozen=True)
class ScaleEvent:
    """Something the autoscaler did or saw, for logs and for measuring reaction times (monotonic seconds)."""

    at: float
    kind: str  # "decision" | "start" | "ready" | "stop" | "exit"
    workers: int
    detail: str = ""
    pid: int | None = None


@dataclass
class WorkerProcesses:
    """The local processes of one pool: `serving` (starting or ready) and `draining` (SIGTERM sent)."""

    settings: WorkerSettings
    home: Path
    serving: list[WorkerProcess] = field(default_factory=list)
    draining: list[WorkerProcess] = field(default_factory=list)
    _names: itertools.count = field(default_factory=itertools.count)

    def start_one(self) -> WorkerProcess:
        w = spawn_worker(self.settings, f"{self.settings.pool}-{os.getpid()}-{next(self._names)}", self.home)
        self.serving.append(w)
        return w

    def stop_one(self) -> WorkerProcess | None:
        """SIGTERM the newest worker (not yet ready ones first): it finishes what it holds, then exits."""
        if not self.serving:
            return None
        w = min(self.serving, key=lambda w: (w.ready_at is not None, -w.started_at))
        self.serving.remove(w)
        if w.proc.poll() is None:
            w.proc.send_signal(signal.SIGTERM)
        self.draining.append(w)
        return w

    def reap(self) -> tuple[list[WorkerProcess], list[WorkerProcess], list[WorkerProcess]]:
        """(newly ready, serving ones that died, drained ones that exited); the dead leave `serving`."""
        ready = [w for w in self.serving if w.ready_at is None and w.poll_ready()]
        died = [w for w in self.serving if w.proc.poll() is not None]
        drained = [w for w in self.draining if w.proc.poll() is not None]
        self.serving = [w for w in self.serving if w not in died]
        self.draining = [w for w in self.draining if w not in drained]
        return ready, died, drained

    def ready_count(self) -> int:
        """Serving workers that are ready (read-only: safe from another thread)."""
        return sum(w.ready_at is not None or w.ready_file.exists() for w in list(self.serving))

    def pids(self) -> list[int]:
        return [w.pid for w in self.serving]

    def stop_all(self, timeout_s: float = 60.0) -> None:
        """SIGTERM every worker, wait for them to drain, SIGKILL what is left."""
        while self.serving:
            self.stop_one()
        deadline = time.monotonic() + timeout_s
        for w in self.draining:
            try:
                w.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker %s (pid %d) did not drain in time; killing it", w.name, w.pid)
                w.proc.kill()
                w.proc.wait()
        self.draining.clear()


StatsReader = Callable[[], Awaitable[QueueStats]]


@dataclass
class Autoscaler:
    """Keeps `procs` at the count `scaling.decide` asks for; `run(stop)` polls until `stop` is set."""

    cfg: ElasticPoolConfig
    procs: WorkerProcesses
    events: list[ScaleEvent] = field(default_factory=list)
    decisions: list[ScaleDecision] = field(default_factory=list)
    _state: ScaleState | None = None
    _thread: threading.Thread | None = field(default=None, repr=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    _stop: asyncio.Event | None = field(default=None, repr=False)

    @property
    def queue(self) -> str:
        """The queue whose backlog this scales on (the pool's, behind the job's task-queue prefix)."""
        settings = self.procs.settings
        return queue_name(settings.pool, settings.temporal.task_queue_prefix)

    @property
    def target(self) -> int:
        return self._state.target if self._state else self.cfg.min_workers

    async def run(self, stop: asyncio.Event, stats: StatsReader | None = None) -> None:
        """Poll, decide, reconcile; on `stop`, SIGTERM every worker and wait for them to drain."""
        if stats is None:  # a server that is down or still starting is waited for, as the workers do
            settings = self.procs.settings
            client = await unless_stopped(connect(settings.temporal, settings.store, wait=Backoff()), stop)
            if client is None:
                return

            async def stats() -> QueueStats:
                return await queue_stats(client, self.queue)

        log.info(
            "autoscaling pool %s: %d..%d workers, %d activities each, a worker per %d of backlog, "
            "cooldowns up %gs / down %gs",
            self.queue,
            self.cfg.min_workers,
            self.cfg.max_workers,
            self.cfg.max_concurrent_activities,
            self.cfg.per_worker,
            self.cfg.scale_up_cooldown_s,
            self.cfg.scale_down_cooldown_s,
        )
        self._state = ScaleState.initial(self.cfg, time.monotonic())
        try:
            self.reconcile()
            while not stop.is_set():
                try:
                    observed = await stats()
                except Exception as e:  # a server restart must not kill the pool: keep what runs, retry
                    log.warning("cannot read the backlog of %s: %s", self.queue, e)
                else:
                    self.observe(observed, time.monotonic())
                self.reconcile()
                try:
                    await asyncio.wait_for(stop.wait(), self.cfg.poll_interval_s)
                except TimeoutError:
                    pass
        finally:
            await asyncio.to_thread(self.procs.stop_all)
            log.info("autoscaler of %s stopped; its workers are gone", self.queue)

    def observe(self, stats: QueueStats, now: float) -> ScaleDecision:
        """Feed one observation to the decision; logs it when the count changes."""
        assert self._state is not None
        self._state, decision = decide(self.cfg, self._state, stats.backlog, stats.add_rate, now)
        self.decisions.append(decision)
        if decision.changed:
            self._event("decision", decision.describe())
            log.info("%s: %s", self.queue, decision.describe())
        else:
            log.debug("%s: %s", self.queue, decision.describe())
        return decision

    def reconcile(self) -> None:
        """Reap exits, then start or stop processes until the serving ones match the target."""
        ready, died, drained = self.procs.reap()
        for w in ready:
            self._event("ready", f"{w.name} ready after {w.ready_at - w.started_at:.1f}s", w.pid)  # type: ignore[operator]
        for w in died:
            self._event("exit", f"{w.name} died (exit code {w.proc.returncode}); replacing it", w.pid, logging.WARNING)
        for w in drained:
            self._event("exit", f"{w.name} drained and exited (code {w.proc.returncode})", w.pid)
        while len(self.procs.serving) < self.target:
            w = self.procs.start_one()
            self._event("start", f"started {w.name}", w.pid)
        while len(self.procs.serving) > self.target:
            w = self.procs.stop_one()
            if w:
                self._event("stop", f"stopping {w.name} (SIGTERM: it drains first)", w.pid)

    def _event(self, kind: str, detail: str, pid: int | None = None, level: int = logging.INFO) -> None:
        self.events.append(
            ScaleEvent(at=time.monotonic(), kind=kind, workers=len(self.procs.serving), detail=detail, pid=pid)
        )
        if kind != "decision":
            log.log(level, "%s: %s (pid %s)", self.queue, detail, pid)

    # ------------------------------------------------------------ in a background thread (the local stack)

    def start_in_thread(self, ready_timeout_s: float = 120.0) -> Autoscaler:
        """Run in a daemon thread with its own event loop; return once min_workers are ready."""
        started = threading.Event()

        async def main() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            started.set()
            await self.run(self._stop)

        self._thread = threading.Thread(
            target=asyncio.run, args=(main(),), name=f"autoscaler-{self.queue}", daemon=True
        )
        self._thread.start()
        started.wait()
        deadline = time.monotonic() + ready_timeout_s
        while self.procs.ready_count() < self.cfg.min_workers:
            dead = [w for w in self.procs.serving if w.proc.poll() is not None]
            if dead:
                raise RuntimeError(
                    f"{dead[0].name} exited with code {dead[0].proc.returncode}; log: {dead[0].log_file}"
                )
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"{self.queue} workers not ready after {ready_timeout_s:g}s")
            time.sleep(0.2)
        return self

    def stop_thread(self, timeout_s: float = 90.0) -> None:
        """Stop the loop (its workers drain and exit) and join the thread."""
        if self._thread is None:
            return
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout_s)
        self._thread = None
