"""The web service's admission rule and its idea of an active caller, without a
network (services/web/admission.py, services/web/activity.py): who a client is
behind proxies, how many sockets may wait per address, when a socket counts
against max_sessions, and which messages keep a call alive."""

from __future__ import annotations

import numpy as np
import pytest

from kame_client.client import EndTurn, SendText
from kame_common.audio import alaw_encode, mulaw_encode
from kame_common.config import ConfigError
from services.web.activity import caller_active, has_sound
from services.web.admission import Admission, client_address, proxy_networks
from services.web.protocols.adapter import Actions
from services.web.protocols.realtime_config import CODINGS

PROXIES = proxy_networks("10.0.0.0/8, 127.0.0.1")


def tone(seconds: float, rate: int = 24000, level: float = 0.1) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    return (np.sin(2 * np.pi * 440 * t) * level * 32767).astype("<i2").tobytes()


def test_a_client_is_its_peer_unless_the_peer_is_a_trusted_proxy():
    assert client_address("198.51.100.9", "203.0.113.1", PROXIES) == "198.51.100.9"
    assert client_address("127.0.0.1", "203.0.113.1", PROXIES) == "203.0.113.1"
    assert client_address("127.0.0.1", None, PROXIES) == "127.0.0.1"
    assert client_address("127.0.0.1", "203.0.113.1", []) == "127.0.0.1"


def test_a_client_cannot_choose_its_address_by_writing_x_forwarded_for():
    # The client wrote "1.2.3.4"; the proxies appended the address they saw, then each other's.
    assert client_address("10.0.0.2", "1.2.3.4, 203.0.113.1, 10.0.0.1", PROXIES) == "203.0.113.1"
    assert client_address("10.0.0.2", "10.0.0.5, 10.0.0.1", PROXIES) == "10.0.0.5"


def test_a_proxy_setting_that_is_no_address_is_refused():
    with pytest.raises(ConfigError, match="trusted_proxies"):
        proxy_networks("10.0.0.0/8, ingress.example")


async def test_sockets_wait_per_address_and_count_only_once_their_call_opens():
    admission = Admission(max_sessions=1, max_waiting_per_address=2)
    first, second = admission.arrive("a"), admission.arrive("a")
    assert first and second
    assert admission.arrive("a") is None, "a third waiting socket from the same address"
    other = admission.arrive("b")
    assert other and admission.active == 0, "waiting sockets hold no slot"
    assert admission.admit(other) == ""
    assert admission.admit(first) == "the web service is at its limit of 1 conversations"
    assert admission.arrive("b"), "a socket with a call waits no more"
    admission.leave(other)
    admission.leave(other)  # twice is once
    assert admission.active == 0 and admission.idle.is_set()
    assert admission.admit(first) == ""
    admission.leave(first)
    admission.leave(second)
    assert admission.arrive("a") and admission.arrive("a")


@pytest.mark.parametrize("name", sorted(CODINGS))
def test_sound_is_told_from_silence_in_every_coding(name):
    coding = CODINGS[name]
    encode = {"audio/pcmu": mulaw_encode, "audio/pcma": alaw_encode}.get(name, bytes)
    rate = coding.rate
    assert has_sound(encode(tone(0.2, rate)), coding)
    assert not has_sound(coding.silence(0.2), coding)
    assert not has_sound(encode(tone(0.2, rate, level=0.0005)), coding), "a line's faint hiss"


def test_only_the_callers_sound_or_text_is_activity():
    assert caller_active(Actions(audio=tone(0.1)))
    assert caller_active(Actions(requests=[SendText("hello")]))
    assert not caller_active(Actions(audio=bytes(4800)))
    assert not caller_active(Actions(requests=[SendText("  "), EndTurn()]))
    assert not caller_active(Actions(send=["session.updated"]))
