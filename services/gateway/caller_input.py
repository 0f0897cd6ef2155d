"""What the caller sends, read by one task of the session (session.py):

- `read_requests` routes each request: audio to `CallerAudio`, keys pressed
  to `CallerKeys`, turn controls and typed text to `CallerTurns`
  (turn_control.py), function results to the oracle stream that asked
  (client_functions.py), commentary, thinking and instructions to
  `CallerContext` (delegation.py), through kame_common.streams' dispatch. A second config,
  a request that carries nothing it knows (a StreamError), or audio that does
  not decode (a SessionError) ends the session.
- `CallerAudio` decodes the caller's chunks and cuts them into FRAME_SECONDS
  frames, each stamped with its seq and the time its chunk arrived, for the
  session to send to the frontend and stt. Those capture times are the
  session's clock: how much the caller has said, and when a stream position
  reached the gateway. A session past max_session_s of caller audio ends
  (OUT_OF_RANGE); every ALIVE_EVERY_FRAMES the record's alive_at is
  refreshed.
- `CallerKeys`: a key the caller pressed (pacing.py limits their rate) goes
  back to the client and into the conversation.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from kame_client.client import DTMF_KEYS
from kame_client.codecs import AudioFormat, CodecError, Decoder, coded
from kame_common.audio import FRAME_SECONDS, SAMPLE_RATE, Framer, Samples, float_to_pcm16
from kame_common.streams import dispatch
from kamepb import common_pb2, gateway_pb2, oracle_pb2
from services.gateway import metrics
from services.gateway.client_output import ClientOutput
from services.gateway.config import GatewaySettings
from services.gateway.delegation import CallerContext
from services.gateway.plan import MAX_CALL_INFO_CHARS, SessionError
from services.gateway.records import SessionRecords
from services.gateway.sidestream import SideStream
from services.gateway.turn_control import CallerTurns

# The session record's alive_at is refreshed this often (in caller frames: 5 s),
# so that a resume token of a session whose gateway died can tell how long ago.
ALIVE_EVERY_FRAMES = round(5.0 / FRAME_SECONDS)


def now_us() -> int:
    """The clock of capture times (wall time, in microseconds)."""
    return time.time_ns() // 1000


async def read_requests(
    requests: AsyncIterator[gateway_pb2.ConverseRequest],
    audio: CallerAudio,
    keys: CallerKeys,
    turns: CallerTurns,
    answer: Callable[[common_pb2.FunctionResult], None],
    context: CallerContext,
) -> None:
    """Every request after the config, until the caller half-closes; then the
    audio's last frames go out."""
    await dispatch(
        requests,
        {
            "audio": lambda r: audio.push(r.audio),
            "dtmf": lambda r: keys.press(r.dtmf),
            "turn_control": turns.handle,  # turn_control.py
            "user_text": turns.handle,
            "function_result": lambda r: answer(r.function_result),
            "context": lambda r: context.handle(r.context),
        },
    )
    await audio.flush()


class CallerAudio:
    """The caller's audio as frames, and their capture times (see the module doc).
    `send` takes each frame to the frontend and stt."""

    def __init__(
        self,
        settings: GatewaySettings,
        input_format: AudioFormat,
        records: SessionRecords,
        send: Callable[[common_pb2.AudioFrame], Awaitable[None]],
    ) -> None:
        self._max_session_s = settings.max_session_s
        self._format = input_format
        self._records = records
        self._send = send
        self._decoder = Decoder(input_format)
        self._framer = Framer()
        self._chunks = 0  # decoded so far, to name the one that does not decode
        self._capture_us: list[int] = []  # capture time of every frame, by seq

    @property
    def frames(self) -> int:
        """Frames sent so far."""
        return len(self._capture_us)

    def heard_s(self) -> float:
        """Seconds of caller audio so far (the next frame's position)."""
        return len(self._capture_us) * FRAME_SECONDS

    def wall_at(self, at_s: float) -> float:
        """Wall time at which the caller's audio at stream position `at_s` reached
        the gateway: the capture time of its frame, less the rest of that frame."""
        if not self._capture_us:
            return time.time()
        seq = min(max(int(at_s / FRAME_SECONDS), 0), len(self._capture_us) - 1)
        return self._capture_us[seq] / 1e6 - ((seq + 1) * FRAME_SECONDS - at_s)

    async def push(self, chunk: bytes) -> None:
        """One chunk of the caller's audio; its frames go out stamped with its arrival."""
        arrival_us = now_us()
        try:
            samples = await coded(self._format, self._decoder.decode, chunk)
        except CodecError as exc:
            raise SessionError(
                grpc.StatusCode.INVALID_ARGUMENT, f"audio chunk {self._chunks}: {exc}"
            ) from None
        self._chunks += 1
        for frame in self._framer.push(samples):
            await self._frame(frame, arrival_us)

    async def flush(self) -> None:
        """The caller is done: what the decoder and the framer still hold goes out."""
        frames = self._framer.push(self._decoder.flush())
        if (tail := self._framer.flush()) is not None:
            frames.append(tail)
        for frame in frames:
            await self._frame(frame, now_us())

    async def _frame(self, samples: Samples, capture_us: int) -> None:
        seq = len(self._capture_us)
        if (seq + 1) * FRAME_SECONDS > self._max_session_s:
            raise SessionError(
                grpc.StatusCode.OUT_OF_RANGE,
                f"the session reached its cap of {self._max_session_s} s of caller audio",
            )
        self._capture_us.append(capture_us)
        if seq % ALIVE_EVERY_FRAMES == ALIVE_EVERY_FRAMES - 1:
            self._records.update_session({"alive_at": time.time()})
        await self._send(
            common_pb2.AudioFrame(
                pcm=float_to_pcm16(samples),
                sample_rate_hz=SAMPLE_RATE,
                seq=seq,
                capture_time_us=capture_us,
            )
        )


class CallerKeys:
    """Keys the caller pressed: back to the client, into the conversation (the
    oracle's, or the gateway's own record while no oracle is open). The record
    keeps the last keys, each a '*' unless dtmf_in_records: they may be a PIN."""

    def __init__(
        self,
        settings: GatewaySettings,
        records: SessionRecords,
        output: ClientOutput,
        oracle: SideStream[oracle_pb2.GuideRequest] | None,
    ) -> None:
        self._shown = settings.dtmf_in_records
        self._records = records
        self._output = output
        self._oracle = oracle
        self._digits = ""  # the last keys pressed in this call, as the record shows them

    async def press(self, dtmf: common_pb2.Dtmf) -> None:
        if dtmf.digit not in DTMF_KEYS:
            raise SessionError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"dtmf.digit: one of 0-9, *, #, A-D, got {dtmf.digit!r}",
            )
        metrics.DTMF_DIGITS.inc()
        self._digits = (self._digits + (dtmf.digit if self._shown else "*"))[-MAX_CALL_INFO_CHARS:]
        self._records.update_session({"dtmf": self._digits})
        await self._output.put(gateway_pb2.ConverseResponse(dtmf=dtmf))
        if self._oracle is None or not self._oracle.push(oracle_pb2.GuideRequest(dtmf=dtmf)):
            self._records.keypress(dtmf.digit, self._shown)
