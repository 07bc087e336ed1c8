"""The docs site: measured tables generated from bench/results, the README's shape, and a strict mkdocs build."""

from __future__ import annotations

import json

import pytest

from bench.report import RESULTS
from bench.tables import DOCS, VIEWS, TableError, marked_pages, regenerate, render, table_names

REPO = DOCS.parent


def test_every_generated_table_matches_its_results_files() -> None:
    """What `python -m bench tables --check` checks: regenerate each page in memory, compare."""
    pages = marked_pages()
    assert pages, "no docs page holds a generated table"
    for page in pages:
        text = page.read_text()
        assert regenerate(text) == text, f"{page.relative_to(REPO)} is out of date: run python -m bench tables"


def test_every_results_file_says_where_its_numbers_came_from() -> None:
    """A table no benchmark writes (the simple form) must say where its numbers came from, and so must every
    transcribed file a view reads."""
    for path in sorted(RESULTS.glob("*.json")):
        doc = json.loads(path.read_text())
        if "columns" in doc:
            assert doc.get("recorded"), f"{path.name}: a table of the simple form needs 'recorded'"
            assert len(doc["columns"]) == len(doc.get("align", doc["columns"]))


def test_every_table_is_used_once_and_every_view_is_used() -> None:
    names = [n for page in marked_pages() for n in table_names(page.read_text())]
    assert len(names) == len(set(names)), "a table is generated on two pages"
    assert set(VIEWS) <= set(names), f"views no page shows: {sorted(set(VIEWS) - set(names))}"


def test_a_marker_is_rewritten_in_place_keeping_its_indent(tmp_path) -> None:
    (tmp_path / "t.json").write_text(
        json.dumps({"recorded": "a test", "columns": ["a", "b"], "align": "lr", "rows": [["x", 1], ["y", None]]})
    )
    text = "intro\n\n  <!-- table: t -->\n  stale\n  <!-- /table -->\n\nafter\n"
    assert regenerate(text, tmp_path) == (
        "intro\n\n  <!-- table: t -->\n  | a | b |\n  |---|---:|\n  | x | 1 |\n  | y |  |\n  <!-- /table -->\n\nafter\n"
    )
    assert regenerate(regenerate(text, tmp_path), tmp_path) == regenerate(text, tmp_path)


def test_a_view_reads_the_shape_its_benchmark_writes(tmp_path) -> None:
    """A fresh `python -m bench resets` file regenerates the resets table (bench/resets.py writes `rows`)."""
    row = {"reset_pool_size": 0, "resets": 1000, "failed": 0, "success_rate": 1.0, "resets_retried": 50}
    row |= {"latency_p50_s": 2.64, "latency_p99_s": 4.71, "resets_per_s": 35.6}
    (tmp_path / "resets.json").write_text(json.dumps({"n": 1000, "rows": [row]}))
    table = render("resets", tmp_path)
    assert table.splitlines()[-1] == "| 0 | 1,000 | 0 | **100.00 %** | 50 (5.00 %) | 2.6 s | 4.7 s | 36 |"


def test_an_unknown_table_or_a_malformed_file_is_an_error_naming_it(tmp_path) -> None:
    with pytest.raises(TableError, match=r"no results file .*nothing\.json"):
        render("nothing", tmp_path)
    (tmp_path / "odd.json").write_text(json.dumps({"modes": []}))
    with pytest.raises(TableError, match=r"odd\.json: no view is registered for it"):
        render("odd", tmp_path)
    (tmp_path / "resets.json").write_text(json.dumps({"rows": [{"reset_pool_size": 0}]}))
    with pytest.raises(TableError, match=r"table resets: resets lack what the view reads"):
        render("resets", tmp_path)
