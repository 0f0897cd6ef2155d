"""services/telephony/sip_adapter.py's guard: every private name of aiosipua and
aiortp it relies on is there, in the shape it expects, in the installed
libraries; and the guard notices when one goes (a stand-in class hides it)."""

from __future__ import annotations

import types
from pathlib import Path

import aiortp
import aiosipua
import pytest

from kame_common.private_names import Guarded, IncompatibleLibraries
from services.telephony import sip_adapter
from services.telephony.sip_adapter import GUARDED, PINNED, missing_private_names
from tests.support.private_names import (
    constraints_pins,
    missing_once_hidden,
    spelled_private_names,
)

PACKAGES = {"aiosipua": aiosipua, "aiortp": aiortp}
ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_libraries_have_every_guarded_name():
    assert missing_private_names() == []


def test_the_adapter_touches_no_private_name_it_does_not_guard():
    """Every `._name` the adapter's code reads or overrides is in GUARDED, but for
    the adapter's own: a touch added without a guard fails here."""
    spelled = spelled_private_names(sip_adapter)
    ours = {*vars(sip_adapter), "_owner"}  # its functions and classes, _Datagrams's owner
    guarded = {entry.name for entry in GUARDED}
    assert spelled - ours - guarded == set()


def test_the_pinned_versions_are_those_of_constraints_txt():
    assert constraints_pins(PINNED) == PINNED


@pytest.mark.parametrize("entry", GUARDED, ids=lambda entry: entry.label)
def test_the_guard_reports_a_removed_name(entry: Guarded):
    missing = missing_once_hidden(entry, PACKAGES, missing_private_names)
    assert missing == [f"{entry.label}: missing"]


def test_the_guard_reports_a_changed_signature():
    class RTPSession(aiortp.RTPSession):
        def _handle_rtp(self, packet: bytes) -> None:  # type: ignore[override]
            """As if an upgrade had dropped the address."""

    changed = types.SimpleNamespace(**{**vars(aiortp), "RTPSession": RTPSession})
    assert missing_private_names({**PACKAGES, "aiortp": changed}) == [
        "aiortp.RTPSession._handle_rtp: takes (packet), expected (data, addr)"
    ]


def test_the_service_refuses_to_start_on_libraries_that_lack_a_name(monkeypatch):
    gone = "aiortp.RTPSession._sender: missing"
    monkeypatch.setattr(sip_adapter, "missing_private_names", lambda: [gone])
    with pytest.raises(IncompatibleLibraries) as refused:
        sip_adapter.check_private_names()
    message = str(refused.value)
    assert "aiosipua 0.7.1" in message and "aiortp 0.8.0" in message
    assert gone in message
