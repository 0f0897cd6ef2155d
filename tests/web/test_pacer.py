"""The caller's audio paced for the gateway (services/web/pacer.py), as both the
Realtime and the Moshi endpoints send it: what `send` gets is what the
gateway's Converse call gets, a message per call."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.web.pacer import LEAD_S, MAX_BACKLOG_S, MAX_PIECE_S, MIN_PIECE_S, SLACK_S, Pacer
from services.web.protocols.realtime_config import CODINGS
from tests.support.clock import FakeClock

PCM = CODINGS["audio/pcm"]  # PCM16 at 24 kHz


async def never(_data: bytes) -> bool:
    return True


def test_the_pacer_sends_at_most_a_lead_ahead_of_the_clock_and_silence_when_starved():
    clock = FakeClock(0.0)
    pacer = Pacer(PCM, never, clock)
    pacer.push(bytes(PCM.bytes_per_s * 5))  # five seconds at once
    pieces = []
    while piece := pacer._next_piece(clock.now):
        pieces.append(PCM.seconds(piece))
        pacer.sent_s += pieces[-1]
    assert max(pieces) <= MAX_PIECE_S and sum(pieces) == pytest.approx(LEAD_S)
    clock.now = 10.0  # the backlog went out long ago; the client sends nothing
    pacer.clear()
    silence = pacer._next_piece(clock.now)
    assert silence == bytes(len(silence)) and PCM.seconds(silence) == MAX_PIECE_S
    pacer.sent_s = clock.now - SLACK_S / 2
    assert pacer._next_piece(clock.now) == b""  # not starved yet


def test_a_backlog_waits_for_a_whole_piece_unless_it_is_all_there_is():
    clock = FakeClock(0.0)
    pacer = Pacer(PCM, never, clock)
    pacer.push(bytes(PCM.bytes_per_s * 3))
    pacer.sent_s = LEAD_S  # the lead is out: the clock allows more as it runs
    clock.now = MIN_PIECE_S / 4
    assert pacer._next_piece(clock.now) == b""  # a sliver: the old pacer sent it
    assert pacer._wake_s() == pytest.approx(MIN_PIECE_S, abs=1e-4)  # when a whole one is due
    clock.now = pacer._wake_s()
    assert PCM.seconds(pacer._next_piece(clock.now)) == pytest.approx(MIN_PIECE_S)

    pacer.clear()
    pacer.push(bytes(PCM.bytes_per_s // 100))  # 10 ms, the end of the input: it goes whole
    clock.now += 0.01
    assert PCM.seconds(pacer._next_piece(clock.now)) == pytest.approx(0.01)


async def test_a_fast_append_goes_in_few_whole_pieces_at_real_time():
    """The whole backlog pushed at once: the old pacer sent ~5,000 messages a
    second of a sample or two once the lead was out; whole pieces are ~13."""
    backlog_s = LEAD_S + 1.55  # 1.55 s after the lead: some 19 pieces
    total = int(backlog_s * PCM.rate) * PCM.bytes_per_sample
    sends: list[tuple[float, float]] = []  # (when, seconds of audio)
    start = time.monotonic()

    async def send(data: bytes) -> bool:
        sends.append((time.monotonic() - start, PCM.seconds(data)))
        return sum(seconds for _, seconds in sends) < total / PCM.bytes_per_s - 1e-9

    pacer = Pacer(PCM, send)
    pacer.push(bytes(total))
    await asyncio.wait_for(pacer.run(), 30)

    pieces = [seconds for _, seconds in sends]
    assert sum(pieces) == pytest.approx(backlog_s, abs=1e-4)
    assert len(sends) <= 2 + 20 + 3, pieces  # the lead's two, then about one per MIN_PIECE_S
    assert min(pieces[:-1]) >= MIN_PIECE_S - 1e-9  # the last: what was left, maybe less
    sent_s = 0.0
    for when, seconds in sends:  # and never more than the lead ahead of the clock
        sent_s += seconds
        assert sent_s <= when + LEAD_S + 0.01, sends


def test_the_backlog_limit_counts_the_audio_being_added():
    pacer = Pacer(PCM, never)
    pacer.push(bytes(PCM.bytes_per_s * int(MAX_BACKLOG_S - 1)))
    assert pacer.has_room(1.0)
    assert not pacer.has_room(1.5)  # the old check looked at the backlog alone: 59 s passed


async def test_the_pacer_sends_a_request_after_the_audio_before_it_and_a_cancel_at_once():
    order: list[str] = []

    async def audio(data: bytes) -> bool:
        order.append(f"audio {len(data)}")
        return True

    def request(name: str):
        async def call() -> bool:
            order.append(name)
            return name != "stop"

        return call

    pacer = Pacer(PCM, audio)
    pacer.push(bytes(PCM.bytes_per_s // 10))
    pacer.push_request(request("end_turn"))
    pacer.push_request(request("cancel_response"), urgent=True)
    pacer.push_request(request("stop"))
    await asyncio.wait_for(pacer.run(), 5)
    assert order == ["cancel_response", "audio 4800", "end_turn", "stop"]


def test_a_pacer_in_the_callers_time_never_stands_silence_in():
    clock = FakeClock()
    pacer = Pacer(PCM, never, clock, fill_silence=False)  # the Moshi protocol's
    clock.now = 10.0  # the client sent nothing for long
    assert pacer._next_piece(clock.now) == b"" and pacer._wake_s() is None  # only audio wakes it
    pacer.push(bytes(PCM.bytes_per_s))  # the client's next second: its own, at once
    assert PCM.seconds(pacer._next_piece(clock.now)) == MAX_PIECE_S
