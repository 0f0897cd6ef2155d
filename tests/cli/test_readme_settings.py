"""The settings tables written by hand say what the settings classes say.

Every table of README.md and of the pages in docs/ (but docs/configuration.md,
which scripts/gen_config_docs.py generates from the classes themselves:
tests/docs/test_configuration_page.py) whose first column is headed "setting" lists
`KAME_<SERVICE>_<FIELD>` variables (later names in a cell may be written
`_<FIELD>`, keeping the first one's prefix; `KAME_<SVC>_`/`KAME_<SERVICE>_`
means every service), their defaults (one per name, or one for all of them)
and, where the meaning is a list of choices, those choices. Each name must be
a field of that service's settings class, each default its default and each
list of choices its `choices`. How README writes a default:
`-` or `empty` = "", a number, `on`/`off`, a `code` string, a port range
`A-B` (one port per service), each optionally followed by a note in
parentheses; `(X on the NAME)` says that service's default differs.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from kame_common.config import ServiceSettings
from tests.docs.markdown import generator

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# The pages written by hand; configuration.md is generated.
PAGES = [README, *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "configuration.md")]
GENERIC = re.compile(r"^KAME_<(SVC|SERVICE)>_")
OVERRIDE = re.compile(r"\((\S+) on the (\w+)\)$")


def settings_classes() -> dict[str, type[ServiceSettings]]:
    """service name -> its settings class (the generated page's own list)."""
    classes: dict[str, type[ServiceSettings]] = generator().settings_classes()
    return classes


def settings_tables(text: str) -> list[list[list[str]]]:
    """The rows (cells) of every table whose first header cell starts with 'setting'."""
    tables, current = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            current = None
            continue
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if current is None:
            current = [] if cells[0].startswith("setting") else None
            if current is not None:
                tables.append(current)
        elif not set(cells[0]) <= set("-: "):
            current.append(cells)
    return tables


def split_outside(text: str, separator: str = ",") -> list[str]:
    """`text` split at `separator`s that are not inside `code` or (parentheses)."""
    parts, depth, in_code, start = [], 0, False, 0
    for index, char in enumerate(text):
        if char == "`":
            in_code = not in_code
        elif char == "(" and not in_code:
            depth += 1
        elif char == ")" and not in_code:
            depth -= 1
        elif char == separator and not in_code and depth == 0:
            parts.append(text[start:index].strip())
            start = index + 1
    return [*parts, text[start:].strip()]


def names_of(cell: str) -> list[str]:
    """Full variable names of a cell: `_FIELD` continues the first name's prefix."""
    names = re.findall(r"`([^`]+)`", cell)
    if not names:
        return []
    prefix = GENERIC.match(names[0]) or re.match(r"^KAME_[A-Z]+_", names[0])
    full = [names[0]]
    for name in names[1:]:
        full.append(prefix.group(0) + name[1:] if name.startswith("_") and prefix else name)
    return full


def parse_default(text: str) -> tuple[Any, dict[str, Any]]:
    """(value, {service: value} overrides) of one README default."""
    overrides = {}
    override = OVERRIDE.search(text)
    if override:
        overrides[override.group(2)] = parse_default(override.group(1))[0]
        text = text[: override.start()].strip()
    else:
        text = re.sub(r"^(`[^`]*`|[^\s(`]+)\s+\(.*\)$", r"\1", text)  # a note: "0 (off)"
    if text in ("-", "empty"):
        return "", overrides
    if text in ("on", "off"):
        return text == "on", overrides
    if re.fullmatch(r"`[^`]*`", text):
        return text[1:-1], overrides
    if re.fullmatch(r"-?\d+(\.\d+)?", text):
        return float(text), overrides
    if re.fullmatch(r"\d+-\d+", text):
        low, high = map(int, text.split("-"))
        return range(low, high + 1), overrides
    raise AssertionError(f"README default {text!r}: not a form this test can read (see its doc)")


def field_of(cls: type, name: str) -> dataclasses.Field:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    assert name in fields, f"README names {name!r}, which {cls.__name__} does not have"
    return fields[name]


def same(readme: Any, default: Any) -> bool:
    if isinstance(default, bool):
        return readme is default
    if isinstance(default, int | float):
        return isinstance(readme, float) and readme == default
    return readme == default


def check_row(cells: list[str], classes: dict[str, type[ServiceSettings]]) -> list[str]:
    """What in one README row disagrees with the code."""
    names = [n for n in names_of(cells[0]) if n.startswith("KAME_")]
    if not names:
        return []  # e.g. OPENAI_API_KEY: read by the oracle from the environment, not a setting
    defaults = split_outside(cells[1])
    if len(defaults) == 1:
        defaults *= len(names)
    assert len(defaults) == len(names), f"{cells[0]}: {len(names)} names, defaults {cells[1]!r}"
    problems = []
    for name, default_text in zip(names, defaults, strict=True):
        value, overrides = parse_default(default_text)
        generic = GENERIC.match(name)
        if generic:
            field_name, services = name[generic.end() :].lower(), sorted(classes)
        else:
            service, field_name = name[len("KAME_") :].split("_", 1)
            services, field_name = [service.lower()], field_name.lower()
            assert services[0] in classes, f"{name}: no service {services[0]!r}"
        defaults_in_code = {s: field_of(classes[s], field_name).default for s in services}
        if isinstance(value, range):
            if sorted(defaults_in_code.values()) != list(value):
                problems.append(f"{name}: README {default_text}, code {defaults_in_code}")
            continue
        for service, in_code in defaults_in_code.items():
            if not same(overrides.get(service, value), in_code):
                problems.append(f"{name} ({service}): README {default_text!r}, code {in_code!r}")
    choices = re.fullmatch(r"(`[^`]+`, )*`[^`]+` or `[^`]+`", cells[2]) and re.findall(
        r"`([^`]+)`", cells[2]
    )
    if choices and len(names) == 1 and not GENERIC.match(names[0]):
        service, field_name = names[0][len("KAME_") :].lower().split("_", 1)
        in_code = field_of(classes[service], field_name).metadata.get("choices")
        if set(choices) != set(in_code or ()):
            problems.append(f"{names[0]}: README lists {choices}, code allows {in_code}")
    return problems


def test_readme_settings_tables_match_the_settings_classes():
    classes = settings_classes()
    assert {"gateway", "frontend", "stt", "oracle"} <= set(classes)
    tables = [table for page in PAGES for table in settings_tables(page.read_text())]
    assert len(tables) >= 3, "the pages' settings tables were not found"
    rows = [row for table in tables for row in table]
    problems = [problem for row in rows for problem in check_row(row, classes)]
    assert not problems, "a page disagrees with the code:\n" + "\n".join(problems)
    checked = {n for row in rows for n in names_of(row[0]) if n.startswith("KAME_")}
    assert "KAME_GATEWAY_MAX_SESSIONS" in checked and len(checked) >= 25


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("-", ("", {})),
        ("empty (plaintext)", ("", {})),
        ("0 (off)", (0.0, {})),
        ("on (off on the gateway)", (True, {"gateway": False})),
        ("`Hmm,|Let me see,`", ("Hmm,|Let me see,", {})),
    ],
)
def test_readme_default_forms(text, expected):
    assert parse_default(text) == expected


def test_a_wrong_default_is_caught():
    classes = settings_classes()
    row = ["`KAME_GATEWAY_MAX_SESSIONS`, `_AUTH_TOKENS`", "0, -", "admission control"]
    assert check_row(row, classes) == ["KAME_GATEWAY_MAX_SESSIONS (gateway): README '0', code 64"]
    wrong_choices = ["`KAME_FRONTEND_ENGINE`", "`tts`", "`tts` or `kame`"]
    assert check_row(wrong_choices, classes)[0].startswith("KAME_FRONTEND_ENGINE: README lists")
