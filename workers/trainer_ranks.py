"""The trainer worker as its ranks' agent: start this node's share of the trainer's ranks (megatron's T×D, or the
torch backend's `fsdp.ranks`), watch them, restart them.

Like torchrun's elastic agent, one agent runs per node (`rollart worker --pool trainer`, with
`--nnodes/--node-rank/--rdzv` on several nodes). Node 0's agent hosts the rendezvous TCPStore and is
the Temporal worker: `run_step` (called by the `train_step` activity) launches the ranks for the
job if they are not running (a new *generation*), posts the step and waits for rank 0's reply.
Other nodes' agents follow the current generation: they start their ranks when it changes and
stop them when it ends. Any rank that exits, or posts a failure, ends the generation on every
node; the step fails with a retryable error and its retry launches a fresh generation, which
resumes from the last checkpoint and recorded steps (the step itself is idempotent). A step whose
own code raised fails non-retryable (`TrainStepFailed`): at once when the rank can tell (an
exception that is no RuntimeError or OSError), else when fresh ranks fail it again with the same cause.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta

from temporalio.exceptions import ApplicationError

from rollart.contracts.activities import TrainStepInput, TrainStepResult
from rollart.contracts.errors import ErrorType
from rollart.spec.config import StoreConfig
from rollart.workers.rank_messages import LaunchSpec, RankCommand, RankError, RankReply, key

__all__ = ["RankGroup", "rank_env", "rendezvous_listener"]

log = logging.getLogger(__name__)

POLL_S = 0.02
"""How often the agent looks at its ranks and the store while it waits."""


def _rank_failed(err: RankError, step: int | None, job: str = "") -> ApplicationError:
    """The activity error for a failed generation: retryable unless a restart cannot help (the step's own error,
    or bad input)."""
    what = f"train step {step} of job {job!r}" if step is not None else "starting the trainer ranks"
    if err.type == ErrorType.TRAIN_STEP_FAILED.value:
        return ErrorType.TRAIN_STEP_FAILED.error(
            f"{what} failed: {err.message}; a retry would fail the same way, fix the cause and resume"
        )
    if err.non_retryable:
        return ErrorType.INVALID_INPUT.error(f"{what} failed: {err.message}")
    return ErrorType.TRAINER_RANK_FAILED.error(
        f"{what} failed: {err.message}; the ranks restart from the last checkpoint and the step is retried"
    )


def _layout(spec: LaunchSpec) -> str:
    """The ranks' layout in words, for logs and errors."""
    cfg = spec.trainer
    if cfg.fsdp is not None:
        return f"trainer.fsdp ranks {cfg.fsdp.ranks}"
    return f"trainer.parallel tensor {cfg.parallel.tensor} x data {cfg.parallel.data}"


def rendezvous_listener(host: str, port: int) -> socket.socket:
    """The listening socket of node 0's TCPStore, bound to `host` itself rather than every interface.

    torch's TCPStore binds the wildcard (`::`) whatever host it is given, and it has no authentication: anyone who
    reaches the port can post rank commands. Bound here and handed to it (`master_listen_fd`), one node's store
    (`127.0.0.1:PORT`) is reachable from this machine only, and several nodes' from the address `--rdzv` names.
    A name that is not one of this machine's addresses (a Service's) falls back to every interface: then only
    the trainer's pods may reach the port (the NetworkPolicy `rollart k8s render` writes).
    """
    try:
        addrs = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:  # a pod's own name not in DNS yet: the store does not need it to listen
        addrs = []
    for family, _, _, _, addr in addrs:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
        except OSError:
            sock.close()
            if ipaddress.ip_address(addr[0].split("%")[0]).is_loopback:
                raise
            continue
        sock.listen(128)
        return sock
    log.warning("the rendezvous host %s is not an address of this machine: its store listens on every interface", host)
    if socket.has_dualstack_ipv6():
        return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=128)
    return socket.create_server(("", port), backlog=128)


def rank_env(nnodes: int) -> dict[str, str]:
    """A rank's environment: on one node, gloo's and NCCL's own sockets (their pairs' listeners) on loopback too,
    unless the user chose an interface."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if nnodes == 1:
        for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            env.setdefault(name, "lo")
    return env


class RankGroup:
    """This node's trainer ranks and the agent's side of the rendezvous store."""

    def __init__(
        self,
        *,
        nnodes: int = 1,
        node_rank: int = 0,
        rdzv: str | None = None,
        store: StoreConfig | None = None,
        keep_weight_versions: int = 2,
        start_timeout_s: float = 900.0,
    ) -> None:
        import torch.distributed as dist

        from rollart.infra.local.devserver import free_port

        self.nnodes, self.node_rank = nnodes, node_rank
        self.rdzv = rdzv or f"127.0.0.1:{free_port()}"
        self.payload_store = store or StoreConfig()
        self.keep_weight_versions = keep_weight_versions
        self.start_timeout_s = start_timeout_s
        host, port = self.rdzv.rsplit(":", 1)
        self._listener: socket.socket | None = None
        if node_rank == 0:
            self._listener = rendezvous_listener(host, int(port))
        self.store = dist.TCPStore(
            host,
            int(port),
            is_master=node_rank == 0,
            timeout=timedelta(seconds=60),
            wait_for_workers=False,
            master_listen_fd=self._listener.fileno() if self._listener is not None else None,
        )
        self._procs: list[subprocess.Popen] = []
        self._gen: str | None = None
        self._spec: LaunchSpec | None = None
        self._next_cmd = 0
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._launches = 0
        self._last_failure: tuple[str, int, str] | None = None  # (job, step, cause) of the last step that failed

    # ---- node 0: run steps ----------------------------------------------------------------------

    def run_step(self, inp: TrainStepInput, cancelled: threading.Event) -> TrainStepResult:
        """Run one step on the ranks, launching them first if needed; rank 0's result (blocking)."""
        if self.node_rank != 0:
            raise RuntimeError("only node 0's trainer worker runs steps")
        spec = LaunchSpec(
            job_id=inp.job_id,
            model_dir=inp.model_dir,
            run_dir=inp.run_dir,
            trainer=inp.trainer,
            store=self.payload_store,
            keep_weight_versions=self.keep_weight_versions,
            nnodes=self.nnodes,
            rdzv=self.rdzv,
        )
        with self._lock:
            if self._gen is None or self._spec is None or not spec.same_ranks(self._spec):
                self._launch(spec, cancelled)
            gen, n = self._gen, self._next_cmd
            self._next_cmd += 1
            self.store.set(key(gen, "cmd", n), RankCommand(op="train", step=inp).model_dump_json())
            reply = RankReply.model_validate_json(self._await(key(gen, "result", n), cancelled, step=inp.step))
            if reply.result is not None:  # a trained step's all-reduces needed every rank: all read the command
                self.store.delete_key(key(gen, "cmd", n))
                self.store.delete_key(key(gen, "result", n))
        if reply.error is not None:
            raise ApplicationError(reply.error.message, type=reply.error.type, non_retryable=reply.error.non_retryable)
        if reply.result is None:
            raise RuntimeError(f"rank 0 replied to step {inp.step} with neither a result nor an error")
        return reply.result

    def _launch(self, spec: LaunchSpec, cancelled: threading.Event) -> None:
        """End the current generation (if any), start a new one for `spec` and wait until every rank is ready."""
        world = spec.world_size
        if world % self.nnodes:
            raise ErrorType.INVALID_INPUT.error(
                f"{_layout(spec)} = {world} ranks do not split over {self.nnodes} trainer nodes; use a world size "
                "divisible by --nnodes"
            )
        self._end_generation("a new launch")
        self._launches += 1
        gen = f"{uuid.uuid4().hex[:8]}-{self._launches}"
        self.store.set(key(gen, "launch"), spec.model_dump_json())
        self.store.set("gen", gen)
        self._gen, self._spec, self._next_cmd = gen, spec, 0
        t0 = time.monotonic()
        log.info(
            "launching %d trainer ranks (%s, %d per node on %d nodes) for job %s, generation %s",
            world,
            _layout(spec),
            spec.per_node,
            self.nnodes,
            spec.job_id,
            gen,
        )
        self._start_local(gen, spec)
        deadline = time.monotonic() + self.start_timeout_s
        while int(self.store.add(key(gen, "ready"), 0)) < world:
            self._check(gen, cancelled, step=None)
            if time.monotonic() > deadline:
                self._end_generation("start timeout")
                raise ErrorType.TRAINER_RANK_FAILED.error(
                    f"trainer ranks not ready after {self.start_timeout_s:g}s (see the worker log)"
                )
            time.sleep(POLL_S * 5)
        log.info("trainer ranks ready in %.1fs (generation %s)", time.monotonic() - t0, gen)

    def _await(self, reply_key: str, cancelled: threading.Event, step: int) -> bytes:
        while not self.store.check([reply_key]):
            self._check(self._gen, cancelled, step)
            time.sleep(POLL_S)
        return self.store.get(reply_key)

    def _check(self, gen: str | None, cancelled: threading.Event, step: int | None) -> None:
        """Raise (ending the generation) if a rank died, one posted a failure, or the activity was cancelled."""
        if gen is None:
            raise RuntimeError("no generation is running")
        if cancelled.is_set():
            self._end_generation("the step was cancelled")
            raise ErrorType.TRAINER_RANK_FAILED.error(f"train step {step} was cancelled")
        err = self._failure(gen)
        if err is not None:
            job = self._spec.job_id if self._spec is not None else ""
            self._end_generation(err.message)
            raise _rank_failed(self._repeated(err, job, step), step, job)

    def _repeated(self, err: RankError, job: str, step: int | None) -> RankError:
        """`err`, made TrainStepFailed when the previous attempt of this step failed with the same cause.

        Fresh ranks (a new generation) failing a step the same way again means the step's own code
        fails, not a rank: a dead peer shows as another cause (a connection error naming its address).
        """
        seen = (job, step, err.cause) if err.cause and step is not None else None
        repeated = seen is not None and seen == self._last_failure
        self._last_failure = seen
        if not repeated:
            return err
        return err.model_copy(
            update={
                "type": ErrorType.TRAIN_STEP_FAILED.value,
                "non_retryable": True,
                "message": f"{err.message} (again, on fresh ranks)",
            }
        )

    def _failure(self, gen: str) -> RankError | None:
        """The generation's posted failure, or one this agent sees: a local rank that exited."""
        if self.store.check([key(gen, "failed")]):
            return RankError.model_validate_json(self.store.get(key(gen, "failed")))
        for rank, proc in self._local_ranks(gen):
            code = proc.poll()
            if code is not None:
                err = RankError(
                    type="TrainerRankDied",
                    message=f"trainer rank {rank} (pid {proc.pid}, node {self.node_rank}) exited with code {code}",
                )
                posted = self.store.compare_set(key(gen, "failed"), "", err.model_dump_json())  # a rank's own first
                return RankError.model_validate_json(posted)
        return None

    # ---- every node: local rank processes -------------------------------------------------------

    def _local_ranks(self, gen: str) -> list[tuple[int, subprocess.Popen]]:
        if gen != self._gen or self._spec is None:
            return []
        first = self.node_rank * self._spec.per_node
        return [(first + i, p) for i, p in enumerate(self._procs)]

    def _start_local(self, gen: str, spec: LaunchSpec) -> None:
        first = self.node_rank * spec.per_node
        for local in range(spec.per_node):
            cmd = [
                sys.executable,
                "-m",
                "rollart.workers.trainer_rank",
                "--rdzv",
                spec.rdzv,
                "--gen",
                gen,
                "--rank",
                str(first + local),
                "--local-rank",
                str(local),
                "--parent-pid",
                str(os.getpid()),
            ]
            self._procs.append(subprocess.Popen(cmd, env=rank_env(spec.nnodes)))
        log.info(
            "node %d: started ranks %d..%d (pids %s)",
            self.node_rank,
            first,
            first + spec.per_node - 1,
            ", ".join(str(p.pid) for p in self._procs),
        )

    def _end_generation(self, why: str) -> None:
        """Kill this node's ranks (they may be stuck in a collective) and mark the generation over for every node."""
        gen = self._gen
        if gen is not None:  # unless a rank posted why first
            self.store.compare_set(
                key(gen, "failed"), "", RankError(type="GenerationEnded", message=why).model_dump_json()
            )
        self._kill_local(why)
        self._gen, self._spec = None, None

    def _kill_local(self, why: str) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        for proc in self._procs:
            proc.wait()
        if self._procs:
            log.info("node %d: stopped %d trainer ranks (%s)", self.node_rank, len(self._procs), why)
        self._procs = []

    # ---- other nodes: follow node 0 -------------------------------------------------------------

    def follow(self) -> None:
        """Nodes 1..N-1: run this node's ranks of whatever generation node 0 launches, until `close()`.

        If node 0 (and its store) goes away, this node's ranks stop and the agent reconnects when it is back.
        """
        while not self._closed.is_set():
            try:
                self._follow_once()
            except (RuntimeError, OSError) as e:  # the store is gone: node 0's agent died or restarted
                self._kill_local(f"lost node 0's store at {self.rdzv}")
                self._gen, self._spec = None, None
                log.warning("node %d: lost node 0's store at %s (%s); reconnecting", self.node_rank, self.rdzv, e)
                self._reconnect()
            time.sleep(POLL_S * 10)
        self._kill_local("the trainer worker is stopping")

    def _follow_once(self) -> None:
        gen = self.store.get("gen").decode() if self.store.check(["gen"]) else None
        if gen != self._gen:
            self._kill_local("node 0 launched a new generation")
            self._gen, self._spec = None, None
            if gen is not None and not self.store.check([key(gen, "failed")]):
                self._spec = LaunchSpec.model_validate_json(self.store.get(key(gen, "launch")))
                self._gen = gen
                self._start_local(gen, self._spec)
        elif gen is not None and self._procs and self._failure(gen) is not None:
            self._kill_local("the generation failed")

    def _reconnect(self) -> None:
        import torch.distributed as dist

        host, port = self.rdzv.rsplit(":", 1)
        while not self._closed.is_set():
            try:
                self.store = dist.TCPStore(
                    host, int(port), is_master=False, timeout=timedelta(seconds=60), wait_for_workers=False
                )
                return
            except (RuntimeError, OSError):
                time.sleep(1.0)

    def close(self) -> None:
        """Stop the ranks (asking them to exit first) and, on node 0, the store."""
        self._closed.set()
        if self.node_rank != 0:
            return  # `follow` stops its ranks on its way out
        with self._lock:
            if self.node_rank == 0 and self._gen is not None:
                self.store.set(key(self._gen, "cmd", self._next_cmd), RankCommand(op="stop").model_dump_json())
                deadline = time.monotonic() + 10
                while any(p.poll() is None for p in self._procs) and time.monotonic() < deadline:
                    time.sleep(POLL_S)
            self._end_generation("the trainer worker is stopping")
