"""Where a tool call runs: the sandbox modes, the bubblewrap command, and the probes that say what works here.

A task picks a `SandboxMode`; `isolation_for` turns it into the `Isolation` a call gets here, or refuses
(`SandboxUnavailable`) where bubblewrap was asked for and cannot run. `bwrap_command` is pure (a layout in, an
argv out) so what the sandbox exposes can be read and tested without running anything; `host_layout` looks at
this machine to fill the layout in; `bubblewrap` runs a sandboxed ``python -c pass`` once per process to tell
whether bubblewrap works here, and `network_isolation` the unsafe mode's ``unshare --net``.

What the sandbox sees: a read-only ``/usr`` (plus the ``/lib*`` and ``/bin`` links of a merged-/usr system, bound
when they are real directories), the interpreter's install prefix read-only with its ``site-packages`` covered
by an empty tmpfs, the snippet at ``/run/snippet.py``, a private size-bounded tmpfs at ``/tmp`` (its working
directory), a minimal read-only ``/dev`` and a ``/proc`` of its own pid namespace; nothing else is writable.
Not the repo, the venv, ``/etc``, ``$HOME`` or the store. Every namespace is new (the network one has only its own
loopback: the host's, 127.0.0.1 included, is out of reach), the snippet runs as uid/gid 65534 with no capabilities,
no environment, in a new session, and dies with its parent.

A root worker starts bubblewrap as uid/gid 65534 (`BwrapLayout.run_as`), not as root: the kernel exempts a process
whose uid is root on the host from RLIMIT_NPROC, namespaced or not, so the sandbox's "uid 65534" would otherwise be
host root and its fork limit void. Started as 65534, bubblewrap needs unprivileged user namespaces, and an
interpreter that uid can reach: the worker's own, or (when that sits under a private home, e.g. pyenv's under
``/root``) the system's ``/usr/bin/pythonX.Y`` of the same version. Where neither works, the root worker's sandbox
runs as before, with a warning that the fork limit does not hold there (`BwrapProbe.note`).
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import TypeAdapter, ValidationError

__all__ = [
    "NETNS_PREFIX",
    "SANDBOX_MODES",
    "SANDBOX_SNIPPET",
    "SANDBOX_UID",
    "BwrapLayout",
    "BwrapProbe",
    "Isolation",
    "NetworkIsolation",
    "SandboxMode",
    "SandboxUnavailable",
    "bubblewrap",
    "bwrap_command",
    "host_layout",
    "isolation_for",
    "network_isolation",
    "probe_bubblewrap",
    "sandbox_mode",
    "spawn_as",
]

log = logging.getLogger(__name__)

SandboxMode = Literal["auto", "bubblewrap", "unsafe_process"]
"""What a task asks for (``env_args.sandbox``): ``auto`` (bubblewrap where it works, else refuse: it may pick a
stronger isolation one day), ``bubblewrap`` (exactly that, else refuse), ``unsafe_process`` (no boundary)."""
SANDBOX_MODES: Final[tuple[SandboxMode, ...]] = ("auto", "bubblewrap", "unsafe_process")
Isolation = Literal["bwrap", "netns", "sockets_disabled"]
"""What a call got: bubblewrap, or the unsafe process with a network namespace or with sockets disabled."""
NetworkIsolation = Literal["netns", "sockets_disabled"]
NETNS_PREFIX: Final = ("--net", "--map-root-user", "--pid", "--fork", "--kill-child", "--")
_MODE: Final = TypeAdapter(SandboxMode)

SANDBOX_SNIPPET: Final = "/run/snippet.py"
"""Where the snippet is inside the sandbox (bound read-only from the host's temporary file)."""
SANDBOX_TMP: Final = "/tmp"  # the sandbox's own private tmpfs, not the host's /tmp
SANDBOX_UID: Final = 65534
"""The uid/gid the snippet runs as inside the sandbox, and the one a root worker starts bubblewrap as."""
_NOBODY: Final = str(SANDBOX_UID)
_TOP_LINKS: Final = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_PROBE_TIMEOUT_S: Final = 10.0


@dataclass(frozen=True)
class BwrapLayout:
    """What of the host the sandbox sees, and which of bwrap's options this bwrap has (Ubuntu 22.04's 0.6 lacks
    ``--size`` and ``--disable-userns``)."""

    bwrap: str
    python: str
    ro_dirs: tuple[str, ...]
    symlinks: tuple[tuple[str, str], ...] = ()  # (target, link) as on the host, e.g. ("usr/lib", "/lib")
    hidden: tuple[str, ...] = ()  # directories inside ro_dirs covered by an empty tmpfs (site-packages)
    tmpfs_size: bool = True
    disable_userns: bool = True
    run_as: int | None = None  # the host uid/gid bwrap is started as (a root worker's: SANDBOX_UID); None: ours


def bwrap_command(layout: BwrapLayout, snippet: str, args: list[str], *, tmp_bytes: int) -> list[str]:
    """The argv that runs ``python -I -S ARGS`` in the sandbox, with the host file `snippet` at `SANDBOX_SNIPPET`."""
    argv = [layout.bwrap, "--unshare-all", "--unshare-user", "--uid", _NOBODY, "--gid", _NOBODY]
    if layout.disable_userns:
        argv.append("--disable-userns")  # no nested namespaces: their setup is the kernel's biggest attack surface
    argv += ["--die-with-parent", "--new-session", "--clearenv", "--cap-drop", "ALL", "--hostname", "sandbox"]
    for path in layout.ro_dirs:
        argv += ["--ro-bind", path, path]
    for target, link in layout.symlinks:
        argv += ["--symlink", target, link]
    for path in layout.hidden:
        argv += ["--tmpfs", path]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    if layout.tmpfs_size:
        argv += ["--size", str(tmp_bytes)]
    argv += ["--tmpfs", SANDBOX_TMP, "--ro-bind", snippet, SANDBOX_SNIPPET, "--remount-ro", "/dev", "--remount-ro", "/"]
    argv += ["--chdir", SANDBOX_TMP]
    return [*argv, "--", layout.python, "-I", "-S", *args]


def spawn_as(layout: BwrapLayout) -> dict[str, Any]:
    """The `subprocess.Popen` arguments that start bwrap as `layout.run_as` (none when it runs as this process)."""
    if layout.run_as is None:
        return {}
    return {"user": layout.run_as, "group": layout.run_as, "extra_groups": []}


def host_layout(bwrap: str, run_as: int | None = None) -> BwrapLayout | None:
    """This machine's layout: the interpreter of this process's base install (or, when `run_as` cannot reach it, the
    system's of the same version), and the directories it needs; None when `run_as` can reach no interpreter."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    prefix = os.path.realpath(sys.base_prefix)
    python = os.path.realpath(sys.executable)
    if not python.startswith(prefix + os.sep):  # a venv made with --copies: run the base install's interpreter
        python = os.path.join(prefix, "bin", version)
    if run_as is not None and not _reachable(python):
        system = [os.path.realpath(p) for p in (f"/usr/bin/{version}", f"/usr/local/bin/{version}")]
        found = [p for p in system if os.path.isfile(p) and _reachable(p)]
        if not found:
            return None
        python, prefix = found[0], os.path.dirname(os.path.dirname(found[0]))
    ro_dirs = ["/usr"]
    symlinks = []
    for path in _TOP_LINKS:
        if os.path.islink(path):
            symlinks.append((os.readlink(path), path))
        elif os.path.isdir(path):
            ro_dirs.append(path)
    if prefix != "/usr" and not prefix.startswith("/usr/"):
        ro_dirs.append(prefix)
    packages = [os.path.join(prefix, "lib", version, d) for d in ("site-packages", "dist-packages")]
    hidden = [p for p in (*packages, os.path.join(prefix, "lib", "python3", "dist-packages")) if os.path.isdir(p)]
    try:
        usage = subprocess.run([bwrap, "--help"], check=False, capture_output=True, timeout=_PROBE_TIMEOUT_S).stdout
    except (OSError, subprocess.TimeoutExpired):
        usage = b""
    return BwrapLayout(
        bwrap=bwrap,
        python=python,
        ro_dirs=tuple(ro_dirs),
        symlinks=tuple(symlinks),
        hidden=tuple(hidden),
        tmpfs_size=b"--size" in usage,
        disable_userns=b"--disable-userns" in usage,
        run_as=run_as,
    )


def _reachable(path: str) -> bool:
    """Whether a user that is neither owner nor group (uid SANDBOX_UID) can reach and run `path` by its name."""
    import stat

    try:
        if not all(os.stat(d).st_mode & stat.S_IXOTH for d in Path(path).parents):
            return False
        return os.stat(path).st_mode & (stat.S_IROTH | stat.S_IXOTH) == stat.S_IROTH | stat.S_IXOTH
    except OSError:
        return False


@dataclass(frozen=True)
class BwrapProbe:
    """Whether bubblewrap runs here: the layout when it does, else why not (for the refusal and the log); `note`
    says what a working sandbox lacks here (a root worker's that could not drop to SANDBOX_UID)."""

    layout: BwrapLayout | None
    why: str = ""
    note: str = ""


def probe_bubblewrap() -> BwrapProbe:
    """Run ``python -I -S -c pass`` in the sandbox once (a root worker: as SANDBOX_UID first); the caller caches and
    logs the answer."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return BwrapProbe(None, "bubblewrap is not installed (no bwrap on PATH)")
    if os.geteuid() != 0:
        return _probe(host_layout(bwrap))
    dropped = _probe(host_layout(bwrap, run_as=SANDBOX_UID))
    if dropped.layout is not None:
        return dropped
    as_root = _probe(host_layout(bwrap))
    note = (
        f"the worker runs as root and bubblewrap cannot run as uid {SANDBOX_UID} here ({dropped.why}): the "
        "sandbox's processes are root on the host, which the kernel exempts from the fork limit (RLIMIT_NPROC); "
        "run the worker as a non-root user"
    )
    return BwrapProbe(as_root.layout, as_root.why, note if as_root.layout is not None else "")


def _probe(layout: BwrapLayout | None) -> BwrapProbe:
    if layout is None:
        return BwrapProbe(
            None,
            f"no Python {sys.version_info.major}.{sys.version_info.minor} that uid "
            f"{SANDBOX_UID} can reach (this one is under a private directory, and /usr/bin has none)",
        )
    with open(os.devnull, "rb") as null:  # any readable file stands for the snippet
        argv = bwrap_command(layout, null.name, ["-c", "pass"], tmp_bytes=1024 * 1024)
        try:
            probe = subprocess.run(
                argv, check=False, capture_output=True, timeout=_PROBE_TIMEOUT_S, env={}, **spawn_as(layout)
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            return BwrapProbe(None, f"bwrap failed to start: {e}")
    if probe.returncode != 0:
        why = probe.stderr.decode(errors="replace").strip() or f"exit status {probe.returncode}"
        return BwrapProbe(None, f"bwrap cannot create its sandbox here ({why[-300:]})")
    return BwrapProbe(layout)


class SandboxUnavailable(ValueError):
    """The task asked for bubblewrap (``auto`` or ``bubblewrap``) and it cannot run here: a job's configuration
    error, refused when the env is built (at load by `rollart check`/`train`, and on the worker at reset)."""


def sandbox_mode(value: object) -> SandboxMode:
    """`value` as a `SandboxMode` (pydantic checks it), or ValueError naming the modes."""
    try:
        return _MODE.validate_python(value)
    except ValidationError:
        modes = ", ".join(map(repr, SANDBOX_MODES))
        raise ValueError(f"sandbox must be one of {modes}, got {value!r}") from None


@functools.cache
def bubblewrap() -> BwrapProbe:
    """Whether bubblewrap runs here: probed once per process (a sandboxed ``python -c pass``), logged once."""
    probe = probe_bubblewrap()
    if probe.layout is not None:
        runs_as = f", started as uid {probe.layout.run_as}" if probe.layout.run_as is not None else ""
        log.info("tool sandbox: bubblewrap works here (%s%s)", probe.layout.bwrap, runs_as)
        if probe.note:
            log.warning("tool sandbox: %s", probe.note)
    else:
        log.warning("tool sandbox: bubblewrap unavailable: %s", probe.why)
    return probe


def isolation_for(mode: SandboxMode) -> Isolation:
    """The isolation a Python tool call gets in `mode` here, or SandboxUnavailable saying how to fix it."""
    if mode == "unsafe_process":
        return network_isolation()
    probe = bubblewrap()
    if probe.layout is None:
        raise SandboxUnavailable(
            f"sandbox {mode!r}: python tool calls run model-written code, which needs the bubblewrap sandbox, and "
            f"it cannot run here: {probe.why}. Fix: install bubblewrap (`make setup` does; apt-get install "
            "bubblewrap) and allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
            "kernel.apparmor_restrict_unprivileged_userns=0, or a container seccomp profile that permits them); "
            "or, for a trusted model only, opt in to a child process that is not a security boundary with "
            "env_args.sandbox: unsafe_process"
        )
    return "bwrap"


@functools.cache
def network_isolation() -> NetworkIsolation:
    """How this process keeps tool calls off the network: probed once (a namespaced `true`), logged once."""
    unshare = shutil.which("unshare")
    if unshare is not None:
        try:
            probe = subprocess.run(
                [unshare, *NETNS_PREFIX, "true"], check=False, capture_output=True, timeout=10, env={}
            )
            if probe.returncode == 0:
                log.info("tool sandbox: no network by a network namespace (unshare --net --map-root-user)")
                return "netns"
            why = probe.stderr.decode(errors="replace").strip() or f"exit status {probe.returncode}"
        except (OSError, subprocess.TimeoutExpired) as e:
            why = str(e)
    else:
        why = "no unshare binary on PATH"
    log.warning(
        "tool sandbox: network namespaces unavailable (%s); falling back to disabling sockets inside the "
        "child interpreter (Python-level only)",
        why,
    )
    return "sockets_disabled"
