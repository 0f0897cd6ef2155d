"""docs/configuration.md is what scripts/gen_config_docs.py makes of the settings
classes today: a setting added, renamed or given another default or help text
without regenerating the page fails here (`make docs` regenerates it)."""

from __future__ import annotations

import dataclasses

from tests.docs.markdown import ROOT, generator


def test_the_committed_page_is_the_generated_one():
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == generator().render(), (
        "docs/configuration.md is stale: run python scripts/gen_config_docs.py"
    )


def test_every_setting_of_every_service_is_on_the_page():
    gen = generator()
    page = (ROOT / "docs" / "configuration.md").read_text()
    classes = gen.settings_classes()
    assert {"gateway", "frontend", "stt", "oracle", "web", "telephony"} <= set(classes)
    # A setting every service shares is listed under the gateway, and under another
    # service only where its default differs.
    shared = {f.name: f.default for f in dataclasses.fields(classes["gateway"])}
    for service, cls in classes.items():
        for field in dataclasses.fields(cls):
            variable = f"`{cls.env_prefix()}{field.name.upper()}`"
            listed_once = service != "gateway" and shared.get(field.name, object()) == field.default
            assert variable in page or listed_once, f"{variable} is not on the page"


def test_a_changed_default_changes_the_row():
    gen = generator()
    field = dataclasses.field(default=7, metadata={"help": "open sessions", "choices": None})
    field.name = "max_sessions"
    assert gen.row("KAME_GATEWAY_", field) == (
        "| `KAME_GATEWAY_MAX_SESSIONS` | `--max-sessions` | 7 | open sessions |"
    )
