"""The 20 ms playout alone, on the real event loop clock: it waits for its
prebuffer, then sends one packet per 20 ms, silence when it runs dry, keeps the
speaking flag with the audio it belongs to, drops the oldest audio beyond its
limit and throws away what is queued on a barge-in."""

from __future__ import annotations

import asyncio

import numpy as np

from kame_common.aio import cancel_and_wait
from services.telephony.playout import PCMU, SLIN, Playout
from tests.support import wait_until

FRAME_80MS = 640  # mu-law bytes the gateway sends per caller frame


class Phone:
    """Records every packet with its arrival time."""

    def __init__(self) -> None:
        self.packets: list[tuple[float, bytes, bool]] = []

    async def send(self, packet: bytes, speaking: bool) -> None:
        self.packets.append((asyncio.get_running_loop().time(), packet, speaking))


async def test_packets_leave_every_20_ms_after_the_prebuffer():
    phone = Phone()
    playout = Playout(PCMU, phone.send, prebuffer_ms=100, max_queued_ms=1000)
    task = asyncio.ensure_future(playout.run())
    playout.push(b"\x01" * FRAME_80MS, speaking=True)  # 80 ms < 100 ms of prebuffer
    await asyncio.sleep(0.1)
    assert phone.packets == []
    for _ in range(4):  # the gateway's pace: 80 ms every 80 ms
        playout.push(b"\x01" * FRAME_80MS, speaking=True)
        await asyncio.sleep(0.08)
    await cancel_and_wait(task)
    times = [t for t, _, _ in phone.packets]
    assert all(len(p) == 160 for _, p, _ in phone.packets)
    gaps = np.diff(times)
    assert abs(float(np.median(gaps)) - 0.020) < 0.003, gaps
    assert playout.stats.packets == len(phone.packets) >= 14


async def test_running_dry_sends_silence_and_counts_an_underrun():
    phone = Phone()
    playout = Playout(PCMU, phone.send, prebuffer_ms=20, max_queued_ms=200)
    task = asyncio.ensure_future(playout.run())
    playout.push(b"\x01" * 200, speaking=True)  # one packet and 40 bytes
    await wait_until(lambda: len(phone.packets) >= 4, "four packets", 2)
    await cancel_and_wait(task)
    first, second, third = (p for _, p, _ in phone.packets[:3])
    assert first == b"\x01" * 160
    assert second == b"\x01" * 40 + b"\xff" * 120  # the rest, padded with mu-law silence
    assert third == b"\xff" * 160
    assert playout.stats.underruns >= 2


async def test_the_speaking_flag_follows_the_audio():
    phone = Phone()
    playout = Playout(SLIN, phone.send, prebuffer_ms=0, max_queued_ms=1000)
    playout.push(b"\x00" * 640, speaking=False)  # 40 ms of silence (SLIN: 320 bytes / 20 ms)
    playout.push(b"\x10" * 640, speaking=True)  # 40 ms of speech
    task = asyncio.ensure_future(playout.run())
    await wait_until(lambda: len(phone.packets) >= 4, "four packets", 2)
    await cancel_and_wait(task)
    assert [speaking for _, _, speaking in phone.packets[:4]] == [False, False, True, True]


async def test_a_barge_in_throws_away_what_is_queued():
    phone = Phone()
    playout = Playout(PCMU, phone.send, prebuffer_ms=100, max_queued_ms=1000)
    playout.push(b"\x01" * 1600, speaking=True)  # 200 ms of an answer
    assert playout.flush() == 1600
    assert playout.queued_ms == 0 and playout.stats.flushed_bytes == 1600


def test_audio_beyond_the_limit_drops_the_oldest():
    playout = Playout(PCMU, Phone().send, prebuffer_ms=100, max_queued_ms=200)
    playout.push(b"\x01" * 1600, speaking=True)  # 200 ms: at the limit
    playout.push(b"\x02" * 800, speaking=True)  # 100 ms more: the oldest 100 ms go
    assert playout.queued_ms == 200 and playout.stats.dropped_bytes == 800
