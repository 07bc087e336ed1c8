"""Run one tool call (a Python snippet or a calculator expression) in a child process under hard limits.

A tool call never stalls the env thread that asked for it and never raises for what the snippet
does: `run_python` and `run_calc` always return a `SandboxResult` whose ``reason`` says how it
ended — ``"ok"``, ``"timeout"`` (wall time), ``"cpu_limit"``, ``"memory_limit"``,
``"output_limit"`` or ``"error"`` (the snippet failed, or the expression was refused).

The child is ``python -I -S`` (isolated: no site-packages, no user env vars) with an empty
environment, a fresh temporary working directory and stdin closed. A small bootstrap forks the
snippet's process and sets its limits before running it: RLIMIT_CPU (SIGXCPU at the limit, SIGKILL a
second later), RLIMIT_AS (memory: an allocation over it raises MemoryError), RLIMIT_FSIZE (files it
writes), RLIMIT_NPROC (a fork-bomb guard; the kernel exempts a process that is root on the host, so a root
worker starts bubblewrap as uid 65534; outside a user namespace it counts all of the user's processes) and
no core dumps. The parent enforces the wall-time limit
itself and reads stdout and stderr with a bound: over ``max_output_chars`` bytes on either stream
the child is killed (``output_limit``). On timeout, output overflow and after every run the whole
process group is killed.

Where the child runs is the task's `SandboxMode` (``env_args.sandbox`` of the tool env); every result names the
`Isolation` it got:

- ``"bwrap"`` (modes ``auto``, the default, and ``bubblewrap``): under bubblewrap (`sandbox_isolation`): every
  namespace new (no network: the host's 127.0.0.1 is out of reach; a ``/proc`` showing only the call), a read-only
  view of only the interpreter's install and the system libraries, a private size-bounded tmpfs as its working
  directory, uid 65534 with no capabilities and no environment. The worker's files (the repo, the venv, the
  store, TLS keys, ``$HOME``) and its ``/proc/<pid>/environ`` are not there to read. Where bubblewrap cannot run
  (not installed, user namespaces blocked), `isolation_for` refuses with `SandboxUnavailable`, naming the fix.
- ``unsafe_process`` (an opt-in by name, for trusted models only): today's process, which bounds buggy or runaway
  output but is **not a security boundary**: the snippet runs as the worker's user and can read and write that
  user's files and read ``/proc``. Its network isolation is ``"netns"`` (``unshare --net --map-root-user --pid
  --fork --kill-child``: no interface up, and a pid namespace so leftovers die with the call; needs user
  namespaces) or, where that fails, ``"sockets_disabled"`` (the child's ``socket`` module refuses; Python-level
  only, walked out of through ``_socket``, ctypes or the class's ``__mro__``).

A calculator expression (`run_calc`) is checked to be arithmetic before it runs, so it runs under bubblewrap where
it works and in the unsafe process otherwise, whatever the mode.
"""

from __future__ import annotations

import json
import logging
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Final, Literal

from rollart.activities.envs.calc_expression import CalcError, check_expression
from rollart.activities.envs.sandbox_isolation import (
    NETNS_PREFIX,
    SANDBOX_MODES,
    SANDBOX_SNIPPET,
    Isolation,
    NetworkIsolation,
    SandboxMode,
    SandboxUnavailable,
    bubblewrap,
    bwrap_command,
    isolation_for,
    network_isolation,
    sandbox_mode,
    spawn_as,
)

__all__ = [
    "SANDBOX_MODES",
    "CalcError",
    "Isolation",
    "NetworkIsolation",
    "Reason",
    "SandboxLimits",
    "SandboxMode",
    "SandboxResult",
    "SandboxUnavailable",
    "bubblewrap",
    "check_expression",
    "isolation_for",
    "network_isolation",
    "run_calc",
    "run_python",
    "sandbox_mode",
]

log = logging.getLogger(__name__)

Reason = Literal["ok", "timeout", "cpu_limit", "memory_limit", "output_limit", "error"]

_MAX_PROCESSES: Final = 32  # RLIMIT_NPROC of the snippet (ignored by the kernel for host root: see spawn_as)
_MAX_FILE_BYTES: Final = 16 * 1024 * 1024  # RLIMIT_FSIZE: the largest file a snippet may write
_MAX_TMP_BYTES: Final = 64 * 1024 * 1024  # bubblewrap's /tmp: all the files of a call together (memory, not disk)
_STDERR_TAIL_CHARS: Final = 1000
_READ_CHUNK: Final = 65536
_STATUS_BYTES: Final = 4096
_REAP_TIMEOUT_S: Final = 5.0


@dataclass(frozen=True)
class SandboxLimits:
    """The limits one tool call runs under; checked on construction, errors name the env_arg."""

    time_limit_s: float = 2.0
    cpu_limit_s: float = 2.0
    memory_mb: int = 256
    max_output_chars: int = 2000

    def __post_init__(self) -> None:
        for name, value, low, high in (
            ("time_limit_s", self.time_limit_s, 0.1, 20.0),
            ("cpu_limit_s", self.cpu_limit_s, 1.0, 20.0),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
                raise ValueError(f"{name} must be a number of seconds in {low:g}..{high:g}, got {value!r}")
        if isinstance(self.memory_mb, bool) or not isinstance(self.memory_mb, int) or not 64 <= self.memory_mb <= 65536:
            raise ValueError(
                f"memory_mb must be an int in 64..65536 (Python itself needs ~30 MB), got {self.memory_mb!r}"
            )
        chars = self.max_output_chars
        if isinstance(chars, bool) or not isinstance(chars, int) or not 16 <= chars <= 1_000_000:
            raise ValueError(f"max_output_chars must be an int in 16..1000000, got {chars!r}")


@dataclass(frozen=True)
class SandboxResult:
    """How one tool call ended. `exit_code` is negative for a signal and None when the call never ran."""

    stdout: str
    stderr_tail: str
    exit_code: int | None
    reason: Reason
    wall_s: float
    isolation: Isolation | None
    truncated: bool = False

    def info(self) -> dict[str, Any]:
        """The JSON-typed summary an env reports per tool call (`StepOutcome.info`)."""
        return {
            "reason": self.reason,
            "wall_s": round(self.wall_s, 4),
            "exit_code": self.exit_code,
            "isolation": self.isolation,
            "truncated": self.truncated,
        }

    def error_line(self, limits: SandboxLimits) -> str | None:
        """One line saying why the call failed (``error: timed out after 2 s``), or None when it ran to the end."""
        if self.reason == "timeout":
            return f"error: timed out after {limits.time_limit_s:g} s"
        if self.reason == "cpu_limit":
            return f"error: CPU time limit of {math.ceil(limits.cpu_limit_s)} s exceeded"
        if self.reason == "memory_limit":
            return f"error: memory limit of {limits.memory_mb} MB exceeded"
        if self.reason == "output_limit":
            return f"error: output over {limits.max_output_chars} chars, stopped"
        if self.reason == "error":
            lines = [line for line in self.stderr_tail.strip().splitlines() if line.strip()]
            return f"error: {lines[-1].strip() if lines else f'exit status {self.exit_code}'}"
        return None


def run_python(code: str, limits: SandboxLimits, mode: SandboxMode = "auto") -> SandboxResult:
    """Run `code` as a Python script in the sandbox `mode` asks for; what it prints to stdout is the output.

    Raises SandboxUnavailable (before running anything) where `mode` needs bubblewrap and it cannot run here.
    """
    return _run(code, limits, isolation_for(mode))


def run_calc(expression: str, limits: SandboxLimits) -> SandboxResult:
    """Evaluate a calculator expression (refused without running if `check_expression` fails): under bubblewrap
    where it works, else in the unsafe process, which is enough for a checked arithmetic expression."""
    try:
        source = check_expression(expression)
    except CalcError as e:
        return SandboxResult(
            stdout="", stderr_tail=f"calc: {e}", exit_code=None, reason="error", wall_s=0.0, isolation=None
        )
    isolation: Isolation = "bwrap" if bubblewrap().layout is not None else network_isolation()
    return _run(f"print({source})\n", limits, isolation)


# The child's first program: fork the snippet's process, limit it, run the snippet in it, and
# report its exit status and CPU time on the status fd (which the snippet never sees).
_BOOTSTRAP: Final = r"""
import json, os, sys, traceback
status_fd, path, cpu_s, memory_b, file_b, nproc, no_sockets = sys.argv[1:8]
pid = os.fork()
if pid == 0:
    import resource
    os.close(int(status_fd))
    for kind, soft, hard in ((resource.RLIMIT_CPU, int(cpu_s), int(cpu_s) + 1),
                             (resource.RLIMIT_AS, int(memory_b), int(memory_b)),
                             (resource.RLIMIT_FSIZE, int(file_b), int(file_b)),
                             (resource.RLIMIT_NPROC, int(nproc), int(nproc)),
                             (resource.RLIMIT_CORE, 0, 0)):
        old_soft, old_hard = resource.getrlimit(kind)
        cap = lambda v: v if old_hard == resource.RLIM_INFINITY else min(v, old_hard)
        resource.setrlimit(kind, (cap(soft), cap(hard)))
    if no_sockets == "1":
        import socket
        def _refuse(*args, **kwargs):
            raise OSError("network access is disabled in this sandbox")
        class _NoSocket(socket.socket):
            def __init__(self, *args, **kwargs):
                _refuse()
        socket.socket = socket.SocketType = _NoSocket
        socket.create_connection = socket.create_server = socket.socketpair = socket.fromfd = _refuse
        import _socket
        _socket.socket = _NoSocket
    with open(path, encoding="utf-8") as f:
        source = f.read()
    sys.argv = ["<tool>"]
    try:
        exec(compile(source, "<tool>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit:
        raise
    except BaseException as e:
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        raise SystemExit(1)
    raise SystemExit(0)
_, status, usage = os.wait4(pid, 0)
code = os.waitstatus_to_exitcode(status)
report = {"exit_code": code, "cpu_s": usage.ru_utime + usage.ru_stime}
os.write(int(status_fd), json.dumps(report).encode())
os._exit(code if code >= 0 else 128 - code)
"""


_SLOTS: Final = threading.BoundedSemaphore(max(2, os.cpu_count() or 2))
"""Tool calls running at once in this process: more than the cores only queue for them (and a worker may hold 64
env sessions); a call's wall-time limit starts once it has a slot."""


def _run(code: str, limits: SandboxLimits, isolation: Isolation) -> SandboxResult:
    with _SLOTS:
        return _run_now(code, limits, isolation)


def _run_now(code: str, limits: SandboxLimits, isolation: Isolation) -> SandboxResult:
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rollart-tool-") as workdir:
        path = os.path.join(workdir, "snippet.py")
        with open(path, "w", encoding="utf-8", errors="replace") as f:
            f.write(code)
        status_read, status_write = os.pipe()
        args = [
            "-X",
            "utf8",
            "-c",
            _BOOTSTRAP,
            str(status_write),
            SANDBOX_SNIPPET if isolation == "bwrap" else path,
            str(math.ceil(limits.cpu_limit_s)),
            str(limits.memory_mb * 1024 * 1024),
            str(_MAX_FILE_BYTES),
            str(_MAX_PROCESSES),
            "1" if isolation == "sockets_disabled" else "0",
        ]
        argv, credentials = _command(isolation, path, args)
        if credentials:  # bwrap started as another uid must reach the snippet (the directory is private, 0700)
            os.chown(workdir, credentials["user"], credentials["group"])
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=workdir,
                env={},
                pass_fds=(status_write,),
                start_new_session=True,
                **credentials,
            )
        except OSError as e:
            os.close(status_read)
            os.close(status_write)
            return SandboxResult(
                stdout="",
                stderr_tail=f"sandbox: cannot start the tool process: {e}",
                exit_code=None,
                reason="error",
                wall_s=time.monotonic() - start,
                isolation=isolation,
            )
        os.close(status_write)
        try:
            stdout, stderr, stopped = _collect(proc, start + limits.time_limit_s, limits.max_output_chars)
        finally:
            _kill_group(proc)  # leftovers too; the leader is not reaped yet, so its pgid cannot have been reused
            try:
                proc.wait(timeout=_REAP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.error("tool sandbox: process %d did not die within %g s of SIGKILL", proc.pid, _REAP_TIMEOUT_S)
            status = _read_status(status_read)
        wall_s = time.monotonic() - start
    exit_code = status.get("exit_code", proc.returncode) if stopped is None else None
    err_text = stderr.decode("utf-8", errors="replace")
    reason = stopped or _reason(exit_code, float(status.get("cpu_s", 0.0)), err_text, limits)
    cap = limits.max_output_chars
    return SandboxResult(
        stdout=stdout[:cap].decode("utf-8", errors="replace"),
        stderr_tail=err_text[-_STDERR_TAIL_CHARS:],
        exit_code=exit_code,
        reason=reason,
        wall_s=wall_s,
        isolation=isolation,
        truncated=len(stdout) > cap,
    )


def _command(isolation: Isolation, path: str, args: list[str]) -> tuple[list[str], dict[str, Any]]:
    """The argv running ``python -I -S ARGS`` under `isolation` (never a weaker one than asked for), and the uid to
    start it as (`spawn_as`: a root worker's bwrap runs as uid 65534, so the fork limit holds)."""
    if isolation == "bwrap":
        layout = bubblewrap().layout
        if layout is None:
            raise SandboxUnavailable(f"sandbox: bubblewrap cannot run here: {bubblewrap().why}")
        return bwrap_command(layout, path, args, tmp_bytes=_MAX_TMP_BYTES), spawn_as(layout)
    if isolation == "netns":
        return [shutil.which("unshare") or "unshare", *NETNS_PREFIX, sys.executable, "-I", "-S", *args], {}
    return [sys.executable, "-I", "-S", *args], {}


def _collect(proc: subprocess.Popen[bytes], deadline: float, cap: int) -> tuple[bytes, bytes, Reason | None]:
    """Read stdout (its first `cap` + 1 bytes) and stderr (a bounded tail) until both close or a limit stops it."""
    if proc.stdout is None or proc.stderr is None:
        raise RuntimeError("sandbox: the tool process was started without stdout/stderr pipes")
    out, err = bytearray(), bytearray()
    err_total = 0
    with selectors.DefaultSelector() as sel:
        for stream in (proc.stdout, proc.stderr):
            os.set_blocking(stream.fileno(), False)
            sel.register(stream, selectors.EVENT_READ)
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return bytes(out), bytes(err), "timeout"
            for key, _ in sel.select(timeout=remaining):
                try:
                    chunk = os.read(key.fd, _READ_CHUNK)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(key.fileobj)
                elif key.fileobj is proc.stdout:
                    out += chunk[: cap + 1 - len(out)]
                    if len(out) > cap:
                        return bytes(out), bytes(err), "output_limit"
                else:
                    err_total += len(chunk)
                    err = (err + chunk)[-_STDERR_TAIL_CHARS * 4 :]
                    if err_total > max(cap, _STDERR_TAIL_CHARS) * 16:
                        return bytes(out), bytes(err), "output_limit"
    # Both pipes closed: wait for the leader to exit, without reaping it (its pgid must stay ours to kill).
    while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.monotonic() >= deadline:
            return bytes(out), bytes(err), "timeout"
        time.sleep(0.005)
    return bytes(out), bytes(err), None


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_status(fd: int) -> dict[str, Any]:
    """The bootstrap's report (exit code, CPU seconds of the snippet), or {} when it never wrote one."""
    try:
        os.set_blocking(fd, False)
        raw = os.read(fd, _STATUS_BYTES)
        report = json.loads(raw) if raw else {}
        return report if isinstance(report, dict) else {}
    except (OSError, ValueError):
        return {}
    finally:
        os.close(fd)


def _reason(exit_code: int | None, cpu_s: float, stderr: str, limits: SandboxLimits) -> Reason:
    if exit_code == 0:
        return "ok"
    if exit_code == -signal.SIGXCPU or (exit_code == -signal.SIGKILL and cpu_s >= math.ceil(limits.cpu_limit_s)):
        return "cpu_limit"
    if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
        return "memory_limit"
    return "error"
