"""The documentation site builds with mkdocs in strict mode (what `make docs`
runs): every page of docs/ is in the site's navigation, and every anchor a page
links to on another page exists as mkdocs makes it."""

from __future__ import annotations

import subprocess
import sys

import yaml

from tests.docs.markdown import ROOT


def test_the_site_builds_strict(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "configuration" / "index.html").exists()


def test_every_page_is_in_the_navigation():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    in_nav = {page for entry in config["nav"] for page in entry.values()}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages - in_nav == set(), "pages the site's navigation leaves out"
    assert in_nav - pages == set(), "navigation entries without a page"
