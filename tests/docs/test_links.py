"""Every link of README.md, docs/, CHANGELOG.md and the READMEs beside the code
resolves: a relative file exists, and an anchor (#...) names a heading of the
page it points at. Links to other sites are not followed (no network)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.markdown import PAGES, ROOT, anchors, links


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    problems = []
    for line, target in links(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(root)}:{line}: {target}"
        if not destination.exists():
            problems.append(f"{where}: no such file")
        elif (
            anchor
            and destination.suffix == ".md"
            and anchor not in anchors(destination.read_text())
        ):
            problems.append(f"{where}: no heading makes #{anchor}")
        elif root not in destination.parents and destination != root:
            problems.append(f"{where}: outside the repository")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(page):
    assert page.exists(), f"{page.relative_to(ROOT)} is missing"
    problems = broken_links(page)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_a_broken_link_is_caught(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other page\n\n## A section\n")
    page.write_text(
        "# Page\n\n[ok](other.md#a-section) [file](nowhere.md) [anchor](other.md#nope)\n"
        "[self](#page) [web](https://example.com) `[code](nowhere.md)`\n"
        "```\n[fenced](nowhere.md)\n```\n"
    )
    problems = broken_links(page, tmp_path)
    assert [p.split(": ", 1)[1] for p in problems] == [
        "nowhere.md: no such file",
        "other.md#nope: no heading makes #nope",
    ]
