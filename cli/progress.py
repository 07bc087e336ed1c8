"""The progress bar every long-running command shows: what, how far, how long, and a line of live stats."""

from __future__ import annotations

from typing import Any

__all__ = ["progress_bar"]


def progress_bar(*extra: Any) -> Any:  # -> rich.progress.Progress (imported lazily: `--help` stays quick)
    """A bar of description, bar, n/total, elapsed time and the task's `stats` field, then any `extra` columns."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = [
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[stats]}"),
        *extra,
    ]
    return Progress(*columns, transient=False)
