"""What the docs tests read of a Markdown file: its fenced blocks, its links and
the anchors its headings make (as GitHub and mkdocs both make them for the
headings these pages use: lower case, punctuation dropped, spaces as hyphens)."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# The pages whose links must resolve: the front door, docs/, the changelog and
# every README beside the code.
PAGES = sorted(
    [
        README,
        ROOT / "CHANGELOG.md",
        ROOT / "examples" / "README.md",
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "services").glob("*/README.md"),
    ]
)
FENCE = re.compile(r"^```(\w*)")
HEADING = re.compile(r"^(#{1,6}) (.+?)\s*$")
# [text](target) and ![alt](target); a target has no spaces (the pages write none).
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


@dataclass(frozen=True)
class Block:
    language: str
    text: str
    line: int  # of the opening fence, 1-based


def blocks(text: str) -> list[Block]:
    """The fenced code blocks of `text`, in order."""
    found, language, start, body = [], None, 0, []
    for number, line in enumerate(text.splitlines(), 1):
        opening = FENCE.match(line)
        if language is None and opening:
            language, start, body = opening.group(1), number, []
        elif language is not None and line.startswith("```"):
            found.append(Block(language, "\n".join(body) + "\n", start))
            language = None
        elif language is not None:
            body.append(line)
    return found


def prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) of `text` outside fenced blocks."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of `text`'s headings (a repeated heading gets -1, -2 ...)."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose(text):
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            out.add(base if count == 0 else f"{base}-{count}")
    return out


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every link outside fenced blocks and `code`."""
    found = []
    for number, line in prose(text):
        for match in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
            found.append((number, match.group(1)))
    return found


def generator() -> ModuleType:
    """scripts/gen_config_docs.py as a module (scripts/ is no package): its
    settings_classes() and render() are what the docs tests check against."""
    spec = importlib.util.spec_from_file_location(
        "gen_config_docs", ROOT / "scripts" / "gen_config_docs.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
