"""Caller audio to the gateway at real time, for the endpoints whose clients send
it as they like (the Realtime and Moshi protocols, through bridge.py).

The gateway wants caller audio as a phone sends it: at real time, 80 ms at
least every `idle_timeout_s`, never far ahead of the clock, at most a second a
message. Clients send it as they like (a microphone's chunks, or a whole file
at once, then nothing while they listen), so `Pacer` stands between them: it
sends what the client gave as soon as the clock allows, in pieces the gateway
takes, and silence while the client sends nothing, so that the full-duplex
agent, whose frames follow the caller's, goes on talking. Requests (a commit, a
typed message) go in the same stream, after the audio pushed before them.

Unless `fill_silence` is off (the Moshi protocol): then the client's own audio
is the call's time, as for kyutai's moshi server, which steps once per frame a
client sends. The gateway answers one agent frame per caller frame, so with no
silence of ours in between, the agent's frame for the client's sample k is
output sample k, however fast or slow, steady or jittery the client sends;
silence stood in for a late client shifted every later reply by its length.

A backlog goes out in whole pieces of MIN_PIECE_S or more, each as the clock
allows it: sending the sliver the clock allowed the moment it allowed it made
a message of a sample or two, thousands a second for one fast client.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable

from services.web.protocols.realtime_config import AudioCoding

# How far the audio sent may run ahead of the clock (the gateway refuses more
# than its input_burst_s, 2 s by default, ahead).
LEAD_S = 1.0
# How long the client may send nothing before silence stands in for it.
SLACK_S = 0.1
MAX_PIECE_S = 0.5  # the most one message to the gateway carries (its max_chunk_s: 1 s)
# The least one message carries while more waits (one 80 ms frame, what the
# gateway's agents take at a time); less goes only when it is all there is.
MIN_PIECE_S = 0.08
MAX_BACKLOG_S = 60.0  # audio pushed and not sent yet; the endpoints refuse more
GatewayCall = Callable[[], Awaitable[bool]]  # a ConverseClient request: False once the call is over


class Pacer:
    """Caller audio to the gateway at real time (see the module's docstring)."""

    def __init__(
        self,
        coding: AudioCoding,
        send: Callable[[bytes], Awaitable[bool]],
        clock: Callable[[], float] = time.monotonic,
        fill_silence: bool = True,
    ) -> None:
        self.coding = coding
        self.send = send
        self.clock = clock
        self.fill_silence = fill_silence
        self.backlog = bytearray()
        self.sent_s = 0.0
        self.pushed = 0  # bytes of audio pushed, all told
        self.consumed = 0  # ... of them sent or cleared
        # Requests with the `pushed` count they wait for (-1: none).
        self.requests: deque[tuple[int, GatewayCall]] = deque()
        self._arrived = asyncio.Event()

    @property
    def backlog_s(self) -> float:
        return len(self.backlog) / self.coding.bytes_per_s

    def has_room(self, seconds: float) -> bool:
        """Whether `seconds` more audio keep the backlog within MAX_BACKLOG_S."""
        return self.backlog_s + seconds <= MAX_BACKLOG_S

    def push(self, data: bytes) -> None:
        self.backlog += data
        self.pushed += len(data)
        self._arrived.set()

    def push_request(self, request: GatewayCall, urgent: bool = False) -> None:
        """`request` goes after the audio pushed before it (a commit ends the turn
        once the gateway has heard it), or, `urgent`, before any audio waiting."""
        if urgent:
            self.requests.appendleft((-1, request))
        else:
            self.requests.append((self.pushed, request))
        self._arrived.set()

    def clear(self) -> None:
        self.consumed += len(self.backlog)
        self.backlog.clear()

    async def run(self) -> None:
        """Until the call is over (a send returns False). The one writer of the
        call: grpc.aio takes one write at a time."""
        start = self.clock()
        while True:
            self._arrived.clear()  # before looking: a push from now on wakes the wait
            while self.requests and self.requests[0][0] <= self.consumed:
                if not await self.requests.popleft()[1]():
                    return
            elapsed = self.clock() - start
            piece = self._next_piece(elapsed)
            if piece:
                if not await self.send(piece):
                    return
                self.sent_s += self.coding.seconds(piece)
                continue
            wake_s = self._wake_s()
            timeout_s = None if wake_s is None else max(0.0, wake_s - elapsed)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), timeout_s)

    def _next_piece(self, elapsed: float) -> bytes:
        """What to send now: appended audio the clock allows, or silence where the
        client fell behind (if it fills silence); b"" if nothing yet."""
        if self.backlog:
            allowed = self._whole_samples(min(MAX_PIECE_S, elapsed + LEAD_S - self.sent_s))
            size = min(allowed, len(self.backlog))
            if size < min(self._whole_samples(MIN_PIECE_S), len(self.backlog)):
                return b""  # a sliver while more waits: the next whole piece is due soon
            piece = bytes(self.backlog[:size])
            del self.backlog[:size]
            self.consumed += len(piece)
            return piece
        if self.fill_silence and self.sent_s < elapsed - SLACK_S:
            return self.coding.silence(min(MAX_PIECE_S, elapsed - self.sent_s))
        return b""

    def _wake_s(self) -> float | None:
        """When the clock lets the backlog's next piece go (a sample late, so that
        it surely does), or, with none, when silence is due (None: never, only
        the client's audio wakes it)."""
        if not self.backlog:
            return self.sent_s + SLACK_S if self.fill_silence else None
        piece_s = min(MIN_PIECE_S, self.backlog_s)
        return self.sent_s - LEAD_S + piece_s + 1 / self.coding.rate

    def _whole_samples(self, seconds: float) -> int:
        if seconds <= 0:
            return 0
        step = self.coding.bytes_per_sample
        return int(seconds * self.coding.rate) * step
