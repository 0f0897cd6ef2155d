"""services/telephony/sip_adapter.py's guard: every private name of aiosipua and
aiortp it relies on is there, in the shape it expects, in the installed
libraries; and the guard notices when one goes (a stand-in class hides it)."""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Any

import aiortp
import aiosipua
import pytest

from services.telephony import sip_adapter
from services.telephony.sip_adapter import GUARDED, PINNED, Guarded, missing_private_names

PACKAGES = {"aiosipua": aiosipua, "aiortp": aiortp}
ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_libraries_have_every_guarded_name():
    assert missing_private_names() == []


def test_the_adapter_touches_no_private_name_it_does_not_guard():
    """Every `._name` the adapter's code reads or overrides is in GUARDED, but for
    the adapter's own: a touch added without a guard fails here."""
    code = Path(sip_adapter.__file__).read_text().split('"""', 2)[2]  # past the docstring
    spelled = set(re.findall(r"(?:\.|def |class )(_[a-zA-Z]\w*)", code))
    ours = {*vars(sip_adapter), "_owner"}  # its functions and classes, _Datagrams's owner
    guarded = {entry.name for entry in GUARDED}
    assert spelled - ours - guarded == set()


def test_the_pinned_versions_are_those_of_constraints_txt():
    constraints = (ROOT / "constraints.txt").read_text().splitlines()
    assert {f"{name}=={pin}" for name, pin in PINNED.items()} == {
        line for line in constraints if line.split("==")[0] in PINNED
    }


def without(real: type, hidden: str) -> type:
    """A subclass of `real` on which `hidden` cannot be found, neither on the class
    nor on its instances: as if an upgrade had removed it."""

    class Hiding(type(real)):  # type: ignore[misc]
        def __getattribute__(cls, name: str) -> Any:
            if name == hidden:
                raise AttributeError(name)
            return super().__getattribute__(name)

    class StandIn(real, metaclass=Hiding):  # type: ignore[misc, valid-type]
        def __getattribute__(self, name: str) -> Any:
            if name == hidden:
                raise AttributeError(name)
            return super().__getattribute__(name)

    return StandIn


def hiding(holder: object, path: list[str], hidden: str) -> object:
    """A copy of the module `holder` in which the class down `path` hides `hidden`
    (the modules on the way copied too, the originals untouched)."""
    copy = types.SimpleNamespace(**vars(holder))
    step, *rest = path
    inner = getattr(holder, step)
    setattr(copy, step, hiding(inner, rest, hidden) if rest else without(inner, hidden))
    return copy


@pytest.mark.parametrize("entry", GUARDED, ids=lambda entry: entry.label)
def test_the_guard_reports_a_removed_name(entry: Guarded):
    package, *path = entry.owner.split(".")
    upgraded = {**PACKAGES, package: hiding(PACKAGES[package], path, entry.name)}
    assert missing_private_names(upgraded) == [f"{entry.label}: missing"]


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
    with pytest.raises(sip_adapter.IncompatibleSipLibraries) as refused:
        sip_adapter.check_private_names()
    message = str(refused.value)
    assert "aiosipua 0.7.1" in message and "aiortp 0.8.0" in message
    assert gone in message
