"""Sandbox: what one tool call costs under bubblewrap, against the unsafe process and a bare interpreter.

Each mode runs the same small snippet (``print(sum(range(1000)))``) one call at a time, `--repeats` times, the
modes interleaved within each repeat so that a noisy neighbour hits them alike: ``bare`` is ``python -I -S -c``
in a subprocess (no limits, no isolation: the floor); ``unsafe_process`` and ``bubblewrap`` are a `<python>` tool
call stepped in the `tool_use` env built with that `sandbox` (as an env worker builds it from the registry): the
bootstrap's fork and limits, plus ``unshare`` where user namespaces work, or bubblewrap. Reports the median wall time
per call and its ratio to ``bare``; writes bench/results/sandbox.json.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from typing import Any

from bench.report import format_table, summarize, write_results
from rollart.spec.registry import lookup_env

SNIPPET = "print(sum(range(1000)))"
MODES = ("unsafe_process", "bubblewrap")
LIMITS = {"time_limit_s": 10.0, "cpu_limit_s": 5, "memory_mb": 256, "max_output_chars": 200}
COLUMNS = [("name", "mode", ""), ("wall_s", "wall per call (s)", ".4f"), ("speedup_vs_baseline", "vs bare", ".2f")]


def bare() -> dict[str, Any]:
    """One ``python -I -S -c SNIPPET``, no limits and no isolation."""
    start = time.monotonic()
    subprocess.run([sys.executable, "-I", "-S", "-c", SNIPPET], check=True, capture_output=True, env={})
    return {"wall_s": time.monotonic() - start}


def tool_env(mode: str) -> Any:
    """The `tool_use` env with python tools in `mode`; building it probes the sandbox (and refuses, naming the fix,
    where bubblewrap cannot run here), outside the timings."""
    return lookup_env("tool_use").cls(tools=["python"], sandbox=mode, **LIMITS)


def sandboxed(env: Any, mode: str) -> dict[str, Any]:
    """One `<python>` tool call stepped in `env`, timed from the caller's side."""
    env.reset(0)
    start = time.monotonic()
    outcome = env.step(f"<python>{SNIPPET}</python>")
    wall_s = time.monotonic() - start
    if "499500" not in outcome.observation or outcome.info.get("reason") != "ok":
        raise RuntimeError(f"sandbox bench: {mode} returned {outcome!r}")
    return {"wall_s": wall_s, "isolation": outcome.info.get("isolation", "-")}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench sandbox", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="10 repeats (a few seconds)")
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args(argv)
    repeats = 10 if args.quick else args.repeats
    envs = {mode: tool_env(mode) for mode in MODES}
    runs: dict[str, list[dict[str, Any]]] = {"bare": [], **{m: [] for m in MODES}}
    for _ in range(repeats):
        runs["bare"].append(bare())
        for mode, env in envs.items():
            runs[mode].append(sandboxed(env, mode))
    rows = summarize(runs, "bare")
    print(f"sandbox: one tool call ({SNIPPET!r}), medians of {repeats} calls per mode")
    print(format_table(rows, COLUMNS))
    print("  vs bare = bare's median wall / this mode's (< 1: slower)")
    path = write_results("sandbox", rows, repeats=repeats, snippet=SNIPPET)
    print(f"\n  written: {path}")
    return 0


__all__ = ["main"]
