"""Escape attempts against the tool sandbox: what model-written code tries, and what each mode lets through.

Under bubblewrap (the default) every attempt fails: the worker's files (a planted TLS key and store, the repo's
code, the venv), its environment through ``/proc``, the network by any route (sockets, the ``__mro__`` and
``_socket`` routes, a raw ``socket()`` through ctypes), more processes than the limit, more disk than the
tmpfs, writes outside it, and processes that outlive the call. The unsafe mode (``unsafe_process``) is *not* a
boundary: the tests at the end show the planted key and the worker's environment readable from it, and the
sockets guard walked round, so what the docs say of it stays true. Each attempt is one snippet run (< 1 s).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollart.activities.envs import sandbox as sandbox_module
from rollart.activities.envs import sandbox_isolation
from rollart.activities.envs.sandbox import SandboxLimits, SandboxMode, SandboxResult, run_python
from rollart.activities.envs.sandbox_isolation import SANDBOX_SNIPPET, BwrapLayout, bwrap_command

LIMITS = SandboxLimits(time_limit_s=5.0, cpu_limit_s=2, memory_mb=256, max_output_chars=20000)
SECRET = "fake-temporal-api-key-5f1c"
KEY = "-----BEGIN PRIVATE KEY----- planted-tls-key-9b2e"


def _bwrap_or_skip() -> None:
    probe = sandbox_isolation.bubblewrap()
    if probe.layout is None:
        pytest.skip(f"bubblewrap cannot run here ({probe.why}): `make setup` installs it")


def _run(code: str, mode: SandboxMode = "bubblewrap") -> SandboxResult:
    if mode == "bubblewrap":
        _bwrap_or_skip()
    result = run_python(code, LIMITS, mode)
    assert result.reason in ("ok", "error"), result
    return result


@pytest.fixture
def worker() -> Iterator[int]:
    """The pid of a stand-in worker started with an API key in its environment (what /proc/PID/environ shows is
    a process's environment at exec, so setting one in this process would not be seen)."""
    proc = subprocess.Popen(["sleep", "30"], env={"TEMPORAL_API_KEY": SECRET})
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A worker's secrets: a TLS key and a store outside the sandbox, an API key in this process's environment."""
    monkeypatch.setenv("TEMPORAL_API_KEY", SECRET)
    (tmp_path / "tls").mkdir()
    (tmp_path / "tls" / "client.key").write_text(KEY)
    (tmp_path / "store" / "weights").mkdir(parents=True)
    (tmp_path / "store" / "weights" / "model.safetensors").write_text("weights-7d41")
    return {
        "key": tmp_path / "tls" / "client.key",
        "store": tmp_path / "store" / "weights" / "model.safetensors",
        "code": Path(sandbox_module.__file__),
        "venv": Path(sys.prefix) / "pyvenv.cfg",
    }


def _read_all(paths: list[Path]) -> str:
    return "\n".join(
        [
            "for path in " + repr([str(p) for p in paths]) + ":",
            "    try:",
            "        print('read', path, open(path).read()[:64])",
            "    except OSError as e:",
            "        print('refused', path, type(e).__name__)",
        ]
    )


def _environ_scan(worker_pid: int) -> str:
    return "\n".join(
        [
            "import os",
            f"pids = {{'{worker_pid}', '1', str(os.getppid())}} | {{p for p in os.listdir('/proc') if p.isdigit()}}",
            "for pid in sorted(pids):",
            "    try:",
            "        entries = open(f'/proc/{pid}/environ', 'rb').read().decode(errors='replace').split('\\0')",
            "        print(pid, 'read', [e for e in entries if e.startswith('TEMPORAL_API_KEY=')])",
            "    except OSError as e:",
            "        print(pid, 'refused', type(e).__name__)",
        ]
    )


def _connect_every_way(port: int) -> str:
    """Each route to a socket the test listens on; prints ``connected ROUTE`` for each that gets through."""
    return f"""
import ctypes, socket, struct
ADDR = ('127.0.0.1', {port})
def attempt(route, connect):
    try:
        connect()
        print('connected', route)
    except Exception as e:
        print('failed', route, type(e).__name__, e)
def plain():
    socket.create_connection(ADDR, timeout=1)
def mro():
    raw = socket.socket.__mro__[-2]()  # the C socket type, past any Python subclass that refuses
    raw.settimeout(1)
    raw.connect(ADDR)
def underscore():
    import _socket
    s = _socket.SocketType(_socket.AF_INET, _socket.SOCK_STREAM)
    s.settimeout(1)
    s.connect(ADDR)
def raw_syscall():
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.socket(2, 1, 0)
    if fd < 0:
        raise OSError(ctypes.get_errno(), 'socket()')
    addr = struct.pack('!HH4s8x', 2, ADDR[1], bytes([127, 0, 0, 1]))
    addr = struct.pack('=H', 2) + addr[2:]
    if libc.connect(fd, addr, len(addr)) != 0:
        raise OSError(ctypes.get_errno(), 'connect()')
for route, fn in (('socket', plain), ('mro', mro), ('_socket', underscore), ('ctypes', raw_syscall)):
    attempt(route, fn)
"""


# --- unit: the command, read without running it -------------------------------------------------------------------


def test_the_bwrap_command_isolates_everything_and_binds_only_the_interpreter() -> None:
    layout = BwrapLayout(
        bwrap="/usr/bin/bwrap",
        python="/opt/py/bin/python3.11",
        ro_dirs=("/usr", "/opt/py"),
        symlinks=(("usr/lib", "/lib"),),
        hidden=("/opt/py/lib/python3.11/site-packages",),
    )
    argv = bwrap_command(layout, "/tmp/rollart-tool-x/snippet.py", ["-c", "pass"], tmp_bytes=1 << 20)
    joined = " ".join(argv)
    for flags in (
        "--unshare-all --unshare-user --uid 65534 --gid 65534 --disable-userns",
        "--die-with-parent --new-session --clearenv --cap-drop ALL",
        "--ro-bind /usr /usr",
        "--ro-bind /opt/py /opt/py",
        "--symlink usr/lib /lib",
        "--tmpfs /opt/py/lib/python3.11/site-packages",
        "--proc /proc --dev /dev",
        f"--size 1048576 --tmpfs /tmp --ro-bind /tmp/rollart-tool-x/snippet.py {SANDBOX_SNIPPET}",
        "--remount-ro /dev --remount-ro / --chdir /tmp",
        "-- /opt/py/bin/python3.11 -I -S -c pass",
    ):
        assert flags in joined
    assert "--share-net" not in argv and "--bind" not in argv and "--dev-bind" not in argv
    binds = [argv[i + 1] for i, a in enumerate(argv) if a == "--ro-bind"]
    assert binds == ["/usr", "/opt/py", "/tmp/rollart-tool-x/snippet.py"]  # nothing else of the host
    old = bwrap_command(
        BwrapLayout("/usr/bin/bwrap", "/usr/bin/python3", ("/usr",), tmpfs_size=False, disable_userns=False),
        "/s.py",
        [],
        tmp_bytes=1,
    )
    assert "--size" not in old and "--disable-userns" not in old  # Ubuntu 22.04's bubblewrap 0.6


# --- integration: each attempt is one snippet run ------------------------------------------------------------------


@pytest.mark.integration
def test_the_host_layout_binds_neither_the_repo_nor_the_venv_nor_home() -> None:
    _bwrap_or_skip()
    layout = sandbox_isolation.bubblewrap().layout
    assert layout is not None
    repo = Path(sandbox_module.__file__).resolve().parents[2]
    for path in layout.ro_dirs:
        assert not repo.is_relative_to(path) and not Path(path).is_relative_to(repo)
        assert Path(path) != Path.home() and Path(path) != Path("/etc") and Path(path) != Path("/")
        assert not Path(sys.prefix).resolve().is_relative_to(path) or sys.prefix == sys.base_prefix


@pytest.mark.integration
def test_the_planted_key_the_store_the_repo_and_the_venv_cannot_be_read(planted: dict[str, Path]) -> None:
    code = _read_all(list(planted.values())) + "\nimport os\nprint(sorted(os.listdir('/')), dict(os.environ))"
    result = _run(code)
    assert result.reason == "ok" and "read " not in result.stdout and result.stdout.count("refused") == 4
    assert KEY not in result.stdout and "weights-7d41" not in result.stdout and SECRET not in result.stdout
    assert "'etc'" not in result.stdout and "'work'" not in result.stdout and "'home'" not in result.stdout


@pytest.mark.integration
def test_no_environment_of_the_worker_or_anything_else_through_proc(worker: int) -> None:
    result = _run(_environ_scan(worker))
    assert result.reason == "ok" and SECRET not in result.stdout, result.stdout
    assert f"{worker} refused FileNotFoundError" in result.stdout or worker < 10  # not there: a pid namespace


@pytest.mark.integration
def test_no_route_reaches_a_listener_on_loopback() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        result = _run(_connect_every_way(server.getsockname()[1]))
        assert result.reason == "ok" and "connected" not in result.stdout, result.stdout
        assert result.stdout.count("failed") == 4  # refused by the sandbox's own loopback, or unreachable
        server.settimeout(0.2)
        with pytest.raises(TimeoutError):
            server.accept()  # nothing ever reached the listener


_FORK_BOMB = """
import os, time
children = 0
try:
    for _ in range(200):
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
        children += 1
    print('forked', children)
except OSError as e:
    print('stopped after', children, type(e).__name__)
"""


@pytest.mark.integration
def test_forking_stops_at_the_process_limit_even_for_a_root_worker() -> None:
    """The kernel exempts a process that is root on the host from RLIMIT_NPROC, namespaced or not: a root worker
    (this machine's, many containers') starts bubblewrap as uid 65534, and the limit holds."""
    _bwrap_or_skip()
    probe = sandbox_isolation.bubblewrap()
    assert probe.layout is not None
    if os.geteuid() == 0:
        if probe.layout.run_as is None:
            pytest.skip(f"root worker whose bubblewrap cannot run as uid 65534 here: {probe.note}")
        assert probe.layout.run_as == 65534
    result = _run(_FORK_BOMB)
    assert result.stdout.startswith("stopped after") and "BlockingIOError" in result.stdout, result.stdout
    assert int(result.stdout.split()[2]) < 40


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0, reason="what a root worker's sandbox would be without dropping to uid 65534")
def test_a_root_bubblewrap_is_exempt_from_the_fork_limit_which_is_why_it_is_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Keeps the reason for `run_as` true: the same sandbox started as root forks past the limit."""
    _bwrap_or_skip()
    layout = sandbox_isolation.bubblewrap().layout
    assert layout is not None
    as_root = sandbox_isolation.host_layout(layout.bwrap)  # the worker's own interpreter, bwrap as root
    assert as_root is not None and as_root.run_as is None
    monkeypatch.setattr(sandbox_module, "bubblewrap", lambda: sandbox_isolation.BwrapProbe(as_root))
    monkeypatch.setattr(sandbox_isolation, "bubblewrap", lambda: sandbox_isolation.BwrapProbe(as_root))
    result = _run(_FORK_BOMB)
    assert result.stdout.startswith("forked 200"), result.stdout


def test_a_root_worker_starts_bubblewrap_as_uid_65534_where_it_can_reach_the_interpreter() -> None:
    """`spawn_as` and `_reachable`, read without running anything."""
    layout = BwrapLayout("/usr/bin/bwrap", "/usr/bin/python3.11", ("/usr",), run_as=65534)
    assert sandbox_isolation.spawn_as(layout) == {"user": 65534, "group": 65534, "extra_groups": []}
    assert sandbox_isolation.spawn_as(BwrapLayout("/usr/bin/bwrap", "/usr/bin/python3", ("/usr",))) == {}
    with tempfile.TemporaryDirectory(dir="/tmp") as top:  # /tmp: every user may pass through it
        home = Path(top) / "home"
        _check_reachable(Path(top), home)


def _check_reachable(top: Path, home: Path) -> None:
    (home / "bin").mkdir(parents=True)
    python = home / "bin" / "python"
    python.write_text("")
    python.chmod(0o755)
    top.chmod(0o755)
    assert sandbox_isolation._reachable(str(python))
    home.chmod(0o700)  # pyenv's under /root: uid 65534 cannot get through
    assert not sandbox_isolation._reachable(str(python))
    home.chmod(0o755)
    python.chmod(0o750)  # not for others to read and run
    assert not sandbox_isolation._reachable(str(python))


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0, reason="a non-root worker starts bubblewrap as itself")
def test_a_root_workers_sandbox_runs_an_interpreter_uid_65534_can_reach() -> None:
    _bwrap_or_skip()
    layout = sandbox_isolation.bubblewrap().layout
    assert layout is not None
    if layout.run_as is None:
        pytest.skip(f"bubblewrap cannot run as uid 65534 here: {sandbox_isolation.bubblewrap().note}")
    assert layout.run_as == 65534 and sandbox_isolation._reachable(layout.python)
    result = _run("import sys, os; print(sys.version_info[:2], os.getuid())")
    assert result.stdout == f"{tuple(sys.version_info[:2])} 65534\n"  # the worker's Python version


@pytest.mark.integration
def test_filling_the_disk_stops_at_the_tmpfs_and_file_bounds(tmp_path: Path) -> None:
    code = """
import os
chunk = b'x' * (1 << 20)
def fill(name, files, mib):
    total = 0
    try:
        for i in range(files):
            with open(f'{name}-{i}', 'wb') as f:
                for _ in range(mib):
                    f.write(chunk)
                    f.flush()
                    total += len(chunk)
    except OSError as e:
        print(name, total >> 20, 'MiB', e.strerror)
        return
    print(name, total >> 20, 'MiB', 'no error')
fill('one', 1, 32)
for i in range(1):
    os.remove(f'one-{i}')
fill('many', 1000, 8)
"""
    result = _run(code)
    one, many = result.stdout.splitlines()
    assert one.startswith("one ") and "File too large" in one and int(one.split()[1]) <= 16  # RLIMIT_FSIZE
    assert many.startswith("many ") and "No space left on device" in many and int(many.split()[1]) <= 64  # tmpfs


@pytest.mark.integration
def test_nothing_outside_the_tmpfs_is_writable() -> None:
    targets = ["/x", "/usr/x", "/run/x", SANDBOX_SNIPPET, "/proc/x", "/dev/x", sys.base_prefix + "/x"]
    code = f"""
import os
for path in {targets!r}:
    try:
        with open(path, 'w') as f:
            f.write('x')
        print('wrote', path)
    except OSError as e:
        print('refused', path, e.strerror)
with open('/tmp/ok', 'w') as f:
    print('tmp ok', f.write('x'))
"""
    result = _run(code)
    assert "wrote" not in result.stdout and result.stdout.count("refused") == len(targets), result.stdout
    assert "tmp ok 1" in result.stdout


@pytest.mark.integration
def test_a_process_left_behind_dies_with_the_call() -> None:
    marker = f"{time.time_ns() % 10**6}.{os.getpid() % 1000}"
    code = f"""
import os, time
if os.fork() == 0:
    os.setsid()
    os.execv('/usr/bin/sleep', ['sleep', '{marker}'])
time.sleep(0.3)
print('parent done')
"""
    result = _run(code)
    assert result.reason == "ok" and result.stdout == "parent done\n", result
    time.sleep(0.2)
    left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and marker in _cmdline(p)]
    assert left == []


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


# --- the unsafe mode is no boundary: the docs say so, these keep them honest ---------------------------------------


@pytest.mark.integration
def test_the_unsafe_mode_reads_the_planted_key_and_the_worker_environment(
    planted: dict[str, Path], worker: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = _run(_read_all([planted["key"], planted["code"]]), "unsafe_process")
    assert KEY[:64] in files.stdout and files.stdout.count("read ") == 2  # in both of its network modes
    # netns's user namespace happens to keep /proc/<worker>/environ from it (ptrace rules); the fallback does not
    monkeypatch.setattr(sandbox_isolation, "network_isolation", lambda: "sockets_disabled")
    environ = _run(_environ_scan(worker), "unsafe_process")
    assert SECRET in environ.stdout


@pytest.mark.integration
def test_the_unsafe_fallback_without_namespaces_is_walked_round(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox_isolation, "network_isolation", lambda: "sockets_disabled")
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.listen(8)
        result = _run(_connect_every_way(server.getsockname()[1]), "unsafe_process")
    assert result.isolation == "sockets_disabled"
    assert "failed socket" in result.stdout and "connected mro" in result.stdout and "connected ctypes" in result.stdout
