"""Assembles the commands' sub-parsers into `rollart` and runs one: logging, signals, errors → exit codes."""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import os
import signal
import sys

from rollart.cli import (
    attach,
    autoscale,
    env_server,
    evaluate,
    export,
    init_model,
    k8s,
    plan,
    plot,
    report,
    rollout,
    sft,
    sft_data,
    show,
    status,
    store,
    train,
    trajectories,
    up,
    worker,
)
from rollart.cli.errors import EXIT_BAD_INPUT, EXIT_JOB_FAILED, UserError
from rollart.cli.train import is_workflow_failure
from rollart.contracts.errors import failure_of
from rollart.infra.local.devserver import DevServerError
from rollart.workers.local_stack import StackError

__all__ = ["build_parser", "main", "run"]

# In the order `rollart --help` lists them; each module owns its sub-parser and its command.
COMMANDS = (
    init_model,
    worker,
    autoscale,
    env_server,
    up,
    rollout,
    train,
    attach,
    plot,
    report,
    plan,
    evaluate,
    export,
    sft_data,
    sft,
    status,
    trajectories,
    show,
    store,
    k8s,
)


def main(argv: list[str] | None = None) -> None:
    """The console script (`rollart`, `python -m rollart.cli`): `run`, then exit with its code.

    `os._exit` skips the interpreter's teardown, which the temporalio SDK can crash in (a known issue, rc 134/139
    after the command succeeded); what is flushed is all there is to keep. SIGTERM (a scheduler, `kill`) stops
    as Ctrl-C does, so a local stack is torn down, never orphaned.
    """
    _import_from_here()
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # started in the background by a shell
        signal.signal(signal.SIGINT, _raise_keyboard_interrupt)
    rc = run(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def _import_from_here() -> None:
    """A job's import paths (envs, rewards, agent programs and workflows) resolve from the directory `rollart` runs
    in, as they do in the workers it starts there (`python -m`, whose path begins with that directory): the
    console script's own path begins with its bin directory instead."""
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)


def run(argv: list[str] | None = None) -> int:
    """Parse `argv`, run the command, and return its exit code: what tests and other programs call in process.

    0 on success; argparse's own (0 for --help, 2 for a bad flag); 2 for input the user can fix (`UserError`,
    printed without a traceback); 1 when the local stack or dev server cannot start, or the job failed (its
    reason printed: a stall, trajectories that keep failing); 130 on Ctrl-C.
    """
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, or a flag argparse refused (it printed why)
        return e.code if isinstance(e.code, int) else 2
    _configure_logging(args.verbose)
    try:
        return args.func(args) or 0
    except KeyboardInterrupt:
        return 130
    except (DevServerError, StackError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as e:
        if not is_workflow_failure(e):
            raise
        print(f"error: the job failed: {failure_of(e)[0]}", file=sys.stderr)  # its cause, not the wrapper
        return EXIT_JOB_FAILED


def build_parser() -> argparse.ArgumentParser:
    """The whole `rollart` parser; each parsed command carries its function as `args.func`."""
    p = argparse.ArgumentParser(
        prog="rollart",
        description="Agentic RL on disaggregated hardware pools, orchestrated by Temporal.",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.add_argument("--version", action="version", version=f"rollart {importlib.metadata.version('rollart')}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return p


def _configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname).1s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    for noisy in ("temporalio", "vllm", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
