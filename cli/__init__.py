"""The `rollart` command line: one module per command, assembled by `main`. Every command has --help."""

from rollart.cli.main import main, run

__all__ = ["main", "run"]
