"""`python -m bench tables [--check]`: the measured tables of the docs pages, generated from bench/results/*.json.

A page marks each generated table, and everything between the two markers is rewritten:

    <!-- table: weight_sync.transfer -->
    | size | MB | ... |
    <!-- /table -->

A table's name is either a view registered in VIEWS (a results file in the shape its benchmark writes, and the
columns to show: a fresh `python -m bench NAME` run regenerates the table) or the stem of a results file of the
simple form `{"recorded": ..., "columns": [...], "align": "lrr...", "rows": [[...], ...]}`, for measurements no
benchmark writes in one file (a chaos run, runs with different flags, before/after pairs). Such a table is
transcribed, not measured by a run of a benchmark: the page says so under it, its file says how it was measured
(`recorded`), and `--check` leaves it out, since comparing a typed-in table with its typed-in file proves
nothing. `--check` changes nothing and exits 1 if a page's measured tables are out of date.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.comparison_views import COMPARISON_VIEWS
from bench.report import RESULTS
from bench.simulate.views import SIMULATE_VIEWS
from bench.table_views import VIEWS

VIEWS.update(COMPARISON_VIEWS)  # the comparison suite's (bench/comparison_views.py)
VIEWS.update(SIMULATE_VIEWS)  # kept beside the simulator (bench/simulate/views.py)

__all__ = [
    "DOCS",
    "TRANSCRIBED",
    "VIEWS",
    "TableError",
    "is_transcribed",
    "main",
    "regenerate",
    "render",
    "stale_pages",
]

DOCS = Path(__file__).parent.parent / "docs"

_BLOCK = re.compile(
    r"^(?P<indent>[ \t]*)<!-- table: (?P<name>[\w.-]+) -->\n(?P<body>.*?)^(?P=indent)<!-- /table -->$",
    re.M | re.S,
)


class TableError(ValueError):
    """A marker names a table that cannot be made (no view, no results file, a malformed file)."""


# ---------------------------------------------------------------- rendering


def _load(stem: str, results: Path) -> dict[str, Any]:
    path = results / f"{stem}.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise TableError(f"no results file {path} (run its benchmark, or transcribe it there)") from None
    except json.JSONDecodeError as e:
        raise TableError(f"{path}: not JSON ({e})") from e


def markdown(columns: Sequence[str], align: str, rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table: `align` has one letter per column, `l` (left) or `r` (right)."""
    if len(align) != len(columns):
        raise TableError(f"align {align!r} has {len(align)} letters for {len(columns)} columns")
    rule = ["---" if a == "l" else "---:" for a in align]
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join(rule) + "|"]
    for row in rows:
        if len(row) != len(columns):
            raise TableError(f"a row of {len(row)} cells for {len(columns)} columns: {row}")
        lines.append("| " + " | ".join("" if c is None else str(c) for c in row) + " |")
    return "\n".join(lines)


def render(name: str, results: Path = RESULTS) -> str:
    """The Markdown table called `name`: a registered view, or the results file NAME.json in the simple form."""
    view = VIEWS.get(name)
    if view is not None:
        docs = [_load(stem, results) for stem in view.files]
        try:
            rows = view.rows(docs)
            cells = [[col.cell(r) for col in view.columns] for r in rows]
        except (KeyError, TypeError) as e:
            raise TableError(f"table {name}: {', '.join(view.files)} lack what the view reads ({e!r})") from e
        return markdown([c.header for c in view.columns], "".join(c.align for c in view.columns), cells)
    doc = _load(name, results)
    if not isinstance(doc.get("columns"), list) or not isinstance(doc.get("rows"), list):
        raise TableError(f"{results / name}.json: no view is registered for it, and it has no 'columns' and 'rows'")
    columns = doc["columns"]
    table = markdown(columns, doc.get("align", "l" * len(columns)), doc["rows"])
    return f"{table}\n\n{TRANSCRIBED.format(name=name)}"


TRANSCRIBED = "*Transcribed, not written by a benchmark run: how it was measured is in bench/results/{name}.json.*"
"""The line under a table of the simple form."""


def is_transcribed(name: str) -> bool:
    """A table of the simple form (no view reads a benchmark's own file for it)."""
    return name not in VIEWS


def regenerate(text: str, results: Path = RESULTS, *, transcribed: bool = True) -> str:
    """`text` with every marked table block rewritten from the results files (indented like its marker);
    `transcribed=False` leaves the blocks of transcribed tables as they are."""

    def block(m: re.Match[str]) -> str:
        indent, name = m["indent"], m["name"]
        if not transcribed and is_transcribed(name):
            return m[0]
        table = "\n".join(indent + line if line else line for line in render(name, results).splitlines())
        return f"{indent}<!-- table: {name} -->\n{table}\n{indent}<!-- /table -->"

    return _BLOCK.sub(block, text)


def marked_pages(docs: Path = DOCS) -> list[Path]:
    """The docs pages that hold at least one marked table."""
    return sorted(p for p in docs.rglob("*.md") if "<!-- table: " in p.read_text())


def stale_pages(docs: Path = DOCS, results: Path = RESULTS, *, transcribed: bool = True) -> list[Path]:
    """The pages whose tables differ from what the results files give (`transcribed=False`: their measured
    tables only)."""
    return [
        p for p in marked_pages(docs) if regenerate(p.read_text(), results, transcribed=transcribed) != p.read_text()
    ]


def table_names(text: str) -> list[str]:
    return [m["name"] for m in _BLOCK.finditer(text)]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench tables", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a page is out of date")
    args = parser.parse_args(argv)
    try:
        stale = stale_pages(transcribed=not args.check)
        if args.check:
            names = [n for p in marked_pages() for n in table_names(p.read_text())]
            left = sorted(n for n in names if is_transcribed(n))
            print(f"not checked: {len(left)} transcribed tables ({', '.join(left)})")
            for page in stale:
                print(f"out of date: {page.relative_to(DOCS.parent)} (python -m bench tables rewrites it)")
            return 1 if stale else 0
        for page in stale:
            page.write_text(regenerate(page.read_text()))
            print(f"rewrote {page.relative_to(DOCS.parent)}")
    except TableError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    n = sum(len(table_names(p.read_text())) for p in marked_pages())
    print(f"{n} tables in {len(marked_pages())} pages are up to date with {RESULTS.relative_to(DOCS.parent)}/")
    return 0
