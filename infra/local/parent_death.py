"""Children that die with their parent: Linux's parent-death signal, for Python children and for binaries.

`die_with_parent` asks for it from inside a Python process. A binary (the Temporal dev server, the Mooncake
master and keeper) cannot ask, so `guarded(cmd)` runs it through this module: a small Python process asks
for the signal, then replaces itself with the binary (`exec` keeps the pid and the request), so the stack
that started it can still stop it by pid. The signal fires when the *thread* that started the child exits:
start guarded children from a thread that lives as long should (the main thread, here).

`python -m rollart.infra.local.parent_death PARENT_PID SIGNAL CMD...`
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

__all__ = ["die_with_parent", "guarded"]

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int | None = None, sig: signal.Signals = signal.SIGKILL) -> bool:
    """Ask Linux to send `sig` to this process when its parent (pid `parent`) dies; exit now if it already has."""
    parent = os.getppid() if parent is None else parent
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:  # not Linux: nothing to ask
        return False
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig)) != 0:
        return False
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)
    return True


def guarded(cmd: list[str], sig: signal.Signals = signal.SIGTERM) -> list[str]:
    """`cmd` run so that it gets `sig` when this process dies (SIGTERM: the binary shuts down cleanly)."""
    return [sys.executable, "-m", "rollart.infra.local.parent_death", str(os.getpid()), str(int(sig)), *cmd]


def _main(argv: list[str]) -> None:
    parent, sig, cmd = int(argv[0]), signal.Signals(int(argv[1])), argv[2:]
    die_with_parent(parent, sig)
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    _main(sys.argv[1:])
