"""The documentation site builds with no warning, every page is reachable, generated pages are current, and the
README's and the pages' relative links lead somewhere."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipelines.catalog import policies_markdown, scenarios_markdown

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
MKDOCS = Path(sys.executable).with_name("mkdocs")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def nav_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [p for item in node for p in nav_pages(item)]
    if isinstance(node, dict):
        return [p for value in node.values() for p in nav_pages(value)]
    return []


def between(text: str, name: str) -> str:
    begin, end = f"<!-- {name}:begin -->\n", f"<!-- {name}:end -->"
    return text[text.index(begin) + len(begin):text.index(end)]


@pytest.mark.skipif(not MKDOCS.exists() and shutil.which("mkdocs") is None, reason="mkdocs is not installed")
def test_site_builds_strict_without_a_warning(tmp_path):
    mkdocs = str(MKDOCS) if MKDOCS.exists() else shutil.which("mkdocs")
    done = subprocess.run([mkdocs, "build", "--strict", "-f", str(REPO / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                          capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})  # Material's banner about its successor
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    assert (tmp_path / "site" / "contract" / "03-policies" / "index.html").is_file()


def test_every_page_is_in_the_nav_and_every_nav_entry_exists():
    config = yaml.load((REPO / "mkdocs.yml").read_text(), Loader=yaml.SafeLoader)
    listed = set(nav_pages(config["nav"]))
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert pages - listed == set(), "pages missing from mkdocs.yml's nav"
    assert listed - pages == set(), "nav entries without a page"


def test_policy_reference_is_generated_from_the_single_definition():
    page = (DOCS / "reference" / "policies.md").read_text()
    assert between(page, "policies") == policies_markdown(), \
        "docs/reference/policies.md is stale: paste `replab policies --format markdown` between its markers"


def test_scenario_library_page_is_current():
    page = (DOCS / "reference" / "scenarios.md").read_text()
    assert between(page, "scenarios") == scenarios_markdown(), \
        "docs/reference/scenarios.md is stale: paste `replab scenarios --format markdown` between its markers"


def relative_links(file: Path) -> list[tuple[str, Path, str]]:
    """(link, the file it names, its anchor) of every relative Markdown link in `file`."""
    out = []
    for link in LINK.findall(file.read_text()):
        if re.match(r"[a-z]+:", link):  # http:, https:, mailto:
            continue
        path, _, anchor = link.partition("#")
        out.append((link, (file.parent / path).resolve() if path else file, anchor))
    return out


@pytest.mark.parametrize("file", [REPO / "README.md", *sorted(DOCS.rglob("*.md"))], ids=lambda p: p.name)
def test_relative_links_lead_to_files_that_exist(file):
    broken = [link for link, target, _ in relative_links(file) if not target.exists()]
    assert broken == [], f"{file.relative_to(REPO)}: links to nothing: {broken}"


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[there](other.md) and [gone](missing.md) and [web](https://example.org)")
    (tmp_path / "other.md").write_text("# other")
    assert [link for link, target, _ in relative_links(page) if not target.exists()] == ["missing.md"]
