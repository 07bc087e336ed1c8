"""The docs site: measured tables generated from bench/results, the README's shape, and a strict mkdocs build."""

from __future__ import annotations

import html
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from bench.report import RESULTS
from bench.tables import DOCS, VIEWS, TableError, marked_pages, regenerate, render, stale_pages, table_names
from rollart.spec.config import JobSpec, MooncakeConfig, TrainingConfig

REPO = DOCS.parent
README_OPENING = "# rollart\n\n```\nmake run\nmake test\n```\n"
README_MAX_LINES = 250


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
    caption = "*Transcribed, not written by a benchmark run: how it was measured is in bench/results/t.json.*"
    assert regenerate(text, tmp_path) == (
        "intro\n\n  <!-- table: t -->\n  | a | b |\n  |---|---:|\n  | x | 1 |\n  | y |  |\n\n"
        f"  {caption}\n  <!-- /table -->\n\nafter\n"
    )
    assert regenerate(regenerate(text, tmp_path), tmp_path) == regenerate(text, tmp_path)


def test_the_check_judges_measured_tables_and_leaves_transcribed_ones_out(tmp_path) -> None:
    """A typed-in table compared with its typed-in file proves nothing: `--check` leaves it out (and says so on
    the page); a view's table, read from a benchmark's own file, is compared."""
    (tmp_path / "t.json").write_text(json.dumps({"recorded": "by hand", "columns": ["a"], "rows": [["x"]]}))
    row = {"reset_pool_size": 0, "resets": 1000, "failed": 0, "success_rate": 1.0, "resets_retried": 50}
    row |= {"latency_p50_s": 2.64, "latency_p99_s": 4.71, "resets_per_s": 35.6}
    (tmp_path / "resets.json").write_text(json.dumps({"n": 1000, "rows": [row]}))
    docs = tmp_path / "docs"
    docs.mkdir()
    page = docs / "p.md"
    page.write_text("<!-- table: t -->\nedited by hand\n<!-- /table -->\n")
    assert stale_pages(docs, tmp_path, transcribed=False) == []  # not judged
    assert stale_pages(docs, tmp_path) == [page]  # but `python -m bench tables` rewrites it, with its caption
    page.write_text("<!-- table: resets -->\nedited by hand\n<!-- /table -->\n")
    assert stale_pages(docs, tmp_path, transcribed=False) == [page]


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


# ---------------------------------------------------------------- the README and the site's pages


def test_the_readme_fits_on_a_page_and_opens_with_the_two_commands() -> None:
    """Reference material lives on the site; the README says what rollart is, how to run it, where to look next."""
    text = (REPO / "README.md").read_text()
    assert text.startswith(README_OPENING), "README.md must open with '# rollart' and the make run / make test block"
    lines = len(text.splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move reference to docs/"
    )


def test_every_file_the_readme_links_to_exists() -> None:
    """The README's links into docs/ (and the repository) name files that are there."""
    text = (REPO / "README.md").read_text()
    targets = {t.split("#", 1)[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in t}
    assert any(t.startswith("docs/") for t in targets), "the README links to no docs page"
    missing = sorted(t for t in targets if t and not (REPO / t).exists())
    assert not missing, f"README.md links to files that do not exist: {missing}"


def nav_pages(nav: Any) -> list[str]:
    """Every page a mkdocs `nav:` names, sections flattened."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [p for item in nav for p in nav_pages(item)]
    if isinstance(nav, dict):
        return [p for value in nav.values() for p in nav_pages(value)]
    return []


def test_every_nav_page_exists_and_every_docs_page_is_in_the_nav() -> None:
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert config["docs_dir"] == "docs" and config["site_name"] == "rollart"
    pages = nav_pages(config["nav"])
    assert len(pages) == len(set(pages)), "a page is in the nav twice"
    missing = sorted(p for p in pages if not (DOCS / p).is_file())
    assert not missing, f"mkdocs.yml's nav names pages that do not exist: {missing}"
    unlisted = sorted(str(p.relative_to(DOCS)) for p in DOCS.glob("*.md") if str(p.relative_to(DOCS)) not in pages)
    assert not unlisted, f"docs pages missing from mkdocs.yml's nav: {unlisted}"
    assert all((REPO / h).is_file() for h in config["hooks"])


def spec_reference_hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("spec_reference", DOCS / "hooks" / "spec_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def expected_rows() -> list[str]:
    """Field paths the reference must have a row for: every top-level field, and every field of two nested
    sections (so `training.stop_when` and `store.mooncake.lease_s` are checked wherever the models have them)."""
    return [
        *JobSpec.model_fields,
        *(f"training.{name}" for name in TrainingConfig.model_fields),
        *(f"store.mooncake.{name}" for name in MooncakeConfig.model_fields),
        "tasks[].sampling.temperature",
        "tasks[].faults.reset_latency.median_s",
        "kubernetes.pools.<name>.replicas",
        "pools.<name>.max_workers",
    ]


def test_the_spec_reference_has_a_row_per_field_and_only_links_to_its_own_sections() -> None:
    hook = spec_reference_hook()
    page = hook.reference(JobSpec)
    rows = set(re.findall(r"^\| `([^`]+)` \|", page, re.M))
    missing = [path for path in expected_rows() if path not in rows]
    assert not missing, f"the reference has no row for: {missing}"
    anchors = set(re.findall(r"\{#([a-z0-9]+)\}$", page, re.M))
    links = set(re.findall(r"\]\(#([a-z0-9]+)\)", page))
    assert links <= anchors, f"links to sections the page lacks: {sorted(links - anchors)}"
    assert "{#latencymodel}" in page and "`tasks[].faults.step_latency`" in page  # one section, both paths named
    marked = "intro\n\n" + hook.MARKER + "\n"
    assert hook.on_page_markdown(marked, None, None, None).startswith("intro\n\n## The job: JobSpec")
    assert hook.on_page_markdown("no marker", None, None, None) == "no marker"


@pytest.mark.integration
def test_the_site_builds_strictly_with_the_generated_reference(tmp_path: Path) -> None:
    """`mkdocs build --strict`: every page, link and anchor resolves, and the hook writes the reference page."""
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    page = html.unescape((site / "reference" / "index.html").read_text())
    assert "<!-- spec-reference -->" not in page and "The job: JobSpec" in page  # the hook replaced the marker
    missing = [path for path in expected_rows() if f"<td><code>{path}</code></td>" not in page]
    assert not missing, f"the built reference page has no row for: {missing}"
    assert (site / "index.html").is_file() and not (site / "hooks").exists()
