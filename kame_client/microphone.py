"""Caller audio to a Converse call at real time, as a microphone sends it.

A chunk of audio leaves once its last sample has been spoken: chunk k of a
stream that began at `start_t` is due at start_t + (k + 1) * chunk. A caller
that fell behind (a continued call resends what the broken one lost) sends
what is due at once, but never more than BURST_S ahead of the call's own
clock: the gateway refuses a caller more than its input_burst_s ahead.

`kame talk`'s caller (kame_client/caller.py), the benchmarks and the e2e tests
all send their audio this way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import numpy as np

from kame_client.client import ConverseClient
from kame_client.codecs import Encoder, coded
from kame_common.audio import FRAME_SAMPLES, SAMPLE_RATE, Samples

# The most a call's audio runs ahead of its own clock (the gateway's input_burst_s
# is 2 s by default).
BURST_S = 1.0


async def until_spoken(
    start_t: float, index: int, chunk_s: float, clock: Callable[[], float] = time.monotonic
) -> None:
    """Until chunk `index` of a stream that began at `start_t` has been spoken."""
    await asyncio.sleep(max(0.0, start_t + (index + 1) * chunk_s - clock()))


class Microphone:
    """One call's caller audio (float32 mono at 24 kHz), coded in the call's
    input format and sent at real time."""

    def __init__(
        self,
        client: ConverseClient,
        encoder: Encoder,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.encoder = encoder
        self.clock = clock
        self.first_t: float | None = None  # when the call's first chunk went
        self.sent_s = 0.0  # audio this call was sent
        self.chunks = 0  # ... in chunks

    async def send(self, samples: Samples, due_t: float) -> bool:
        """`samples` once `due_t` has come (the clock's time) and the call's clock
        allows it; False once the call is over (its reader has the status)."""
        seconds = len(samples) / SAMPLE_RATE
        wait_s = due_t - self.clock()
        if self.first_t is not None:
            ahead_t = self.first_t + self.sent_s + seconds - BURST_S
            wait_s = max(wait_s, ahead_t - self.clock())
        await asyncio.sleep(max(0.0, wait_s))
        if self.first_t is None:
            self.first_t = self.clock()
        for data in await coded(self.encoder.format, self.encoder.encode, samples):
            if not await self.client.send_audio(data):
                return False
        self.sent_s += seconds
        self.chunks += 1
        return True

    async def stream(self, samples: Samples, chunk: int = FRAME_SAMPLES) -> int:
        """`samples` in chunks of `chunk` samples (the last one padded with
        silence), each once spoken from now on; the chunks sent (fewer once the
        call is over)."""
        start_t = self.clock()
        count = -(-len(samples) // chunk)
        padded = np.zeros(count * chunk, np.float32)
        padded[: len(samples)] = samples
        for index in range(count):
            due_t = start_t + (index + 1) * chunk / SAMPLE_RATE
            if not await self.send(padded[index * chunk : (index + 1) * chunk], due_t):
                return index
        return count

    async def flush(self) -> None:
        """What the encoder still holds (an Opus packet's tail)."""
        for data in self.encoder.flush():
            await self.client.send_audio(data)
