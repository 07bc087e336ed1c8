"""Nothing outlives its worker: the engine processes a worker starts die with it, even when it is SIGKILLed.

vLLM's `AsyncLLM` runs its `EngineCore` in a multiprocessing child (forked here; spawned where CUDA is
already initialised) that never checks for its parent, so a SIGKILLed worker used to leave it running,
holding its memory (and a GPU). Linux's parent-death signal (`prctl(PR_SET_PDEATHSIG)`) fixes that, but it
is cleared by fork and must be set inside each child: `children_die_with_me()` sets it in every child the
worker forks from its main thread (an at-fork hook), and in multiprocessing children it spawns (vLLM loads
`vllm_plugin` in every engine process; it reads `DIE_WITH_PARENT_ENV`). Each engine child also carries
`ENGINE_MARK_ENV` (pool, worker pid, model dir) so that a starting worker can find what a dead one left
behind (`leftover_engines`).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from rollart.infra.local.parent_death import die_with_parent

__all__ = [
    "DIE_WITH_PARENT_ENV",
    "ENGINE_MARK_ENV",
    "PLUGIN",
    "Leftover",
    "children_die_with_me",
    "die_with_parent",
    "leftover_engines",
    "mark_engine_children",
    "plugin_problem",
    "reclaim",
    "vllm_plugin",
]

log = logging.getLogger(__name__)

DIE_WITH_PARENT_ENV = "ROLLART_DIE_WITH_PARENT"
"""Set in a worker's environment: multiprocessing children it spawns ask for the parent-death signal."""
ENGINE_MARK_ENV = "ROLLART_ENGINE_OF"
"""`<pool>|<worker pid>|<model dir>`, in the environment of every engine process a worker starts."""

PLUGIN = "rollart_die_with_parent"
"""The entry point's name in pyproject.toml (group `vllm.general_plugins`)."""
_forker: int | None = None  # the pid forking from its main thread, set just before a fork; read by the child
_hooked = False


def children_die_with_me() -> None:
    """From now on every child this process forks from its main thread, or spawns via multiprocessing, dies with it.

    Only main-thread forks: Linux sends the parent-death signal when the *thread* that forked exits, and the
    main thread lives as long process. vLLM starts its EngineCore from the thread that builds the engine,
    the worker's event loop (the main thread).
    """
    global _hooked
    os.environ[DIE_WITH_PARENT_ENV] = str(os.getpid())
    if not _hooked:
        os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
        _hooked = True


def plugin_problem() -> str | None:
    """Why vLLM will not load `vllm_plugin` in its spawned engine processes (None: it will)."""
    from importlib.metadata import entry_points

    names = {ep.name for ep in entry_points(group="vllm.general_plugins") if ep.value.endswith(":vllm_plugin")}
    if PLUGIN not in names:
        return f"the vLLM plugin {PLUGIN!r} is not installed (re-run `make setup`, or `pip install -e .`)"
    allowed = os.environ.get("VLLM_PLUGINS")
    if allowed is not None and PLUGIN not in allowed.split(","):
        return f"VLLM_PLUGINS={allowed!r} leaves out the plugin {PLUGIN!r}"
    return None


def mark_engine_children(pool: str, model_dir: Path) -> None:
    """Tag this process's environment, which its engine children inherit, with the pool, pid and model dir."""
    os.environ[ENGINE_MARK_ENV] = f"{pool}|{os.getpid()}|{Path(model_dir).resolve()}"


def vllm_plugin() -> None:
    """vLLM general plugin (entry point `vllm.general_plugins`), run in every vLLM process: the worker's own
    multiprocessing children (the EngineCore) ask for the parent-death signal.

    Only direct children of the worker, which starts them from its main thread: vLLM's tensor-parallel
    processes, the EngineCore's children, already end with it (vLLM's death pipe), and may be started from a
    thread whose exit would fire the signal early.
    """
    parent = multiprocessing.parent_process()
    worker = os.environ.get(DIE_WITH_PARENT_ENV)
    if worker and parent is not None and parent.pid == int(worker):
        die_with_parent(parent.pid)


def _before_fork() -> None:
    global _forker
    _forker = os.getpid() if threading.current_thread() is threading.main_thread() else None


def _after_fork_in_child() -> None:
    if _forker is not None:
        die_with_parent(_forker)


@dataclass(frozen=True)
class Leftover:
    """An engine process whose worker is gone: what it is, and what it holds."""

    pid: int
    pool: str
    worker_pid: int
    model_dir: str
    rss_mib: float
    cmdline: str


def leftover_engines(pool: str | None = None) -> list[Leftover]:
    """Engine processes of this user (of `pool`, or any) whose worker is dead: orphans of a killed worker."""
    import psutil

    found = []
    me = os.getuid()
    for p in psutil.process_iter(["pid", "uids", "cmdline"]):
        try:
            if p.info["uids"] is None or p.info["uids"].real != me or p.pid == os.getpid():
                continue
            mark = p.environ().get(ENGINE_MARK_ENV)
            if not mark:
                continue
            mark_pool, worker, model_dir = mark.split("|", 2)
            if int(worker) == p.pid or (pool is not None and mark_pool != pool) or _alive(int(worker), p):
                continue
            rss = p.memory_info().rss / 2**20
            found.append(Leftover(p.pid, mark_pool, int(worker), model_dir, rss, " ".join(p.info["cmdline"] or [])))
        except (psutil.Error, ValueError):
            continue
    return found


def reclaim(leftovers: list[Leftover], model_dir: Path) -> list[Leftover]:
    """SIGKILL the leftovers that are safe to end (this user's, same model dir, worker dead); returns them."""
    import psutil

    killed = []
    for left in leftovers:
        if left.model_dir != str(Path(model_dir).resolve()):
            continue
        try:
            psutil.Process(left.pid).kill()
            killed.append(left)
        except psutil.Error:
            continue
    return killed


def _alive(worker_pid: int, engine: object) -> bool:
    """Is the worker that started `engine` still running (and still its ancestor, not a reused pid)?"""
    import psutil

    try:
        return any(a.pid == worker_pid for a in engine.parents())  # type: ignore[attr-defined]
    except psutil.Error:
        return False
