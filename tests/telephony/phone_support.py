"""What the Twilio and AudioSocket tests share: caller speech at 8 kHz (piper, or
espeak-ng through sox), a gateway behind scripted fake upstreams (a frontend that
speaks and barges in on cue), the telephony service on port 0, and test clients
that speak each protocol as its real peer does (Twilio's Media Streams JSON,
Asterisk's AudioSocket packets), at real time, recording what comes back and when.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import statistics
import struct
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import websockets
from twilio.request_validator import RequestValidator

from kame_common.audio import (
    float_to_pcm16,
    mulaw_decode,
    mulaw_encode,
    pcm16_to_float,
    resample,
    rms_dbfs,
)
from kame_common.server import ServiceRuntime
from kamepb import common_pb2, frontend_pb2, frontend_pb2_grpc, oracle_pb2_grpc, stt_pb2_grpc
from services.gateway.config import GatewaySettings
from services.gateway.server import serve as serve_gateway
from services.telephony.call import PhoneCall
from services.telephony.config import TelephonySettings
from services.telephony.server import TelephonyServer
from tests.gateway.fakes import FakeOracle, FakeStt, StreamLog, serve_fake
from tests.support import conversation, session_record, wait_until
from tests.support.metrics import metric
from tests.support.redis import with_db

TWILIO_TOKEN = "twilio-auth-token-for-tests-0123"
FAKE_GATEWAY_DB = 10  # no frontend publishes here: the gateway uses its frontend_address
PACKET_S = 0.020
ULAW_PACKET = 160  # bytes of 20 ms mu-law at 8 kHz
SLIN_PACKET = 320  # bytes of 20 ms slin (16-bit) at 8 kHz


# ---- caller speech -----------------------------------------------------------------


def piper_to_ulaw(samples: np.ndarray, rate: int = 24_000) -> bytes:
    """Piper's float speech as 8 kHz mu-law, what Twilio carries."""
    return mulaw_encode(float_to_pcm16(resample(samples, rate, 8000)))


def espeak_8k(text: str, encoding: str = "signed-integer", voice: str = "en-us") -> bytes:
    """`text` spoken by espeak-ng, made 8 kHz mono raw by sox: 16-bit slin
    (encoding "signed-integer", Asterisk's) or mu-law ("mu-law", Twilio's)."""
    bits = "16" if encoding == "signed-integer" else "8"
    with tempfile.TemporaryDirectory() as folder:
        wav = Path(folder) / "speech.wav"
        raw = Path(folder) / "speech.raw"
        subprocess.run(["espeak-ng", "-v", voice, "-s", "150", "-w", str(wav), text], check=True)
        subprocess.run(
            ["sox", str(wav), "-r", "8000", "-c", "1", "-b", bits, "-e", encoding, str(raw)],
            check=True,
        )
        return raw.read_bytes()


def packets(audio: bytes, size: int, pad: bytes) -> list[bytes]:
    """`audio` cut into packets of `size` bytes, the last one padded with `pad`."""
    count = -(-len(audio) // size)
    padded = audio + pad * (count * size - len(audio))
    return [padded[i * size : (i + 1) * size] for i in range(count)]


async def at_real_time(items: list[bytes], send: Callable[[bytes], Any]) -> None:
    """`send` each 20 ms packet at its time (absolute deadlines: no drift)."""
    start = time.monotonic()
    for index, item in enumerate(items):
        await asyncio.sleep(max(0.0, start + index * PACKET_S - time.monotonic()))
        await send(item)


def speech_seconds(samples: np.ndarray) -> float:
    """Seconds of speech (20 ms at 8 kHz above -40 dBFS) in `samples`."""
    frames = samples[: len(samples) // 160 * 160].reshape(-1, 160)
    return sum(rms_dbfs(frame) > -40 for frame in frames) * PACKET_S


def speaking_at_end(samples: np.ndarray) -> bool:
    """Whether the last 100 ms of `samples` (8 kHz) carry speech."""
    return len(samples) >= 800 and rms_dbfs(samples[-800:]) > -40


def quiet_at_end(samples: np.ndarray, seconds: float) -> bool:
    """Whether the last `seconds` of `samples` (8 kHz) are silence."""
    size = round(8000 * seconds)
    return len(samples) >= size and rms_dbfs(samples[-size:]) < -50


# ---- metrics -------------------------------------------------------------------------


def refused(provider: str, reason: str) -> float:
    return metric("kame_telephony_refused_calls_total", provider=provider, reason=reason)


def calls_ended(provider: str, ended: str) -> float:
    return metric("kame_telephony_calls_total", provider=provider, ended=ended)


def gateway_sessions() -> float:
    return metric("kame_active_sessions", service="gateway")


# ---- Redis ---------------------------------------------------------------------------------


async def agent_turns(redis_url: str, session_id: str) -> list[str]:
    """What the agent said in the session, as the oracle logged it."""
    turns = await conversation(redis_url, session_id)
    return [turn["text"] for turn in turns if turn["role"] == "agent"]


# ---- a gateway behind fakes --------------------------------------------------------------


class PhoneFrontend(frontend_pb2_grpc.FrontendServicer):
    """One agent frame per caller frame (the caller's own audio echoed back), speaking
    in the frames of `speaking` (seq numbers), a BargeIn after each frame of
    `barge_at`, and the stream ended (the agent's side hangs up) at `end_at`."""

    def __init__(self) -> None:
        self.log = StreamLog()
        self.speaking: set[int] = set()
        self.barge_at: set[int] = set()
        self.end_at: int | None = None

    async def Stream(self, request_iterator, context):  # noqa: N802 (gRPC method name)
        self.log.watch(context)
        requests = aiter(request_iterator)
        first = await anext(requests)
        assert first.WhichOneof("msg") == "config"
        yield frontend_pb2.FrontendResponse(
            ready=frontend_pb2.FrontendReady(engine="fake", replica_id="fake-phone", slot=0)
        )
        async for request in requests:
            self.log.requests.append(request)
            if request.WhichOneof("msg") != "audio":
                continue
            seq = request.audio.seq
            if seq == self.end_at:
                return
            yield frontend_pb2.FrontendResponse(
                audio=frontend_pb2.AgentAudio(frame=request.audio, speaking=seq in self.speaking)
            )
            if seq in self.barge_at:
                yield frontend_pb2.FrontendResponse(barge_in=common_pb2.BargeIn(seq=seq))


@dataclass
class FakeGateway:
    """A real gateway on loopback whose upstreams are scripted fakes."""

    frontend: PhoneFrontend
    runtime: ServiceRuntime
    redis_url: str
    servers: list[grpc.aio.Server]

    @property
    def address(self) -> str:
        return self.runtime.address

    async def session_record(self, session_id: str) -> dict[str, str]:
        return await session_record(self.redis_url, session_id)


@contextlib.asynccontextmanager
async def fake_gateway(redis_url: str) -> AsyncIterator[FakeGateway]:
    frontend = PhoneFrontend()
    addresses, servers = {}, []
    for name, add, servicer in (
        ("frontend", frontend_pb2_grpc.add_FrontendServicer_to_server, frontend),
        ("stt", stt_pb2_grpc.add_SttServicer_to_server, FakeStt()),
        ("oracle", oracle_pb2_grpc.add_OracleServicer_to_server, FakeOracle()),
    ):
        server, addresses[name] = await serve_fake(add, servicer)
        servers.append(server)
    session_redis = with_db(redis_url, FAKE_GATEWAY_DB)
    settings = GatewaySettings(
        host="127.0.0.1",
        port=0,
        metrics_port=0,
        redis_url=session_redis,
        frontend_address=addresses["frontend"],
        stt_address=addresses["stt"],
        oracle_address=addresses["oracle"],
        connect_timeout_s=2.0,
        drain_timeout_s=2.0,
    )
    runtime = await serve_gateway(settings)
    try:
        yield FakeGateway(frontend, runtime, session_redis, servers)
    finally:
        await runtime.stop()
        for server in servers:
            await server.stop(grace=0)


@contextlib.asynccontextmanager
async def telephony_server(
    gateway_address: str, **overrides: Any
) -> AsyncIterator[TelephonyServer]:
    """The telephony service on loopback (HTTP and AudioSocket on port 0, no SIP)."""
    fields: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": 0,
        "metrics_port": 0,
        "sip_port": -1,
        "audiosocket_port": 0,
        "gateway_address": gateway_address,
        "twilio_auth_token": TWILIO_TOKEN,
    }
    settings = TelephonySettings(**{**fields, **overrides})
    settings.validate()
    server = TelephonyServer(settings)
    await server.start()
    try:
        yield server
    finally:
        if not server.telephony.draining:  # a test may have stopped it itself
            await server.stop()


async def the_call(server: TelephonyServer, timeout_s: float = 10.0) -> PhoneCall:
    """The one call in progress once its Converse call has started."""
    calls = server.telephony.calls
    await wait_until(
        lambda: len(calls) == 1 and next(iter(calls)).session_id != "",
        "a call with a gateway session",
        timeout_s,
    )
    return next(iter(calls))


# ---- Twilio ------------------------------------------------------------------------------


@dataclass
class WebhookAnswer:
    status: int
    body: str

    @property
    def stream(self) -> ET.Element:
        root = ET.fromstring(self.body)
        found = root.find("./Connect/Stream")
        assert found is not None, self.body
        return found

    @property
    def stream_url(self) -> str:
        return self.stream.attrib["url"]

    @property
    def parameters(self) -> dict[str, str]:
        return {p.attrib["name"]: p.attrib["value"] for p in self.stream.findall("Parameter")}


def signature(url: str, params: dict[str, str], token: str = TWILIO_TOKEN) -> str:
    """X-Twilio-Signature as Twilio computes it (the twilio package's own code)."""
    return str(RequestValidator(token).compute_signature(url, params))


def call_params(
    call_sid: str, caller: str = "+15551230001", callee: str = "+15559870002"
) -> dict[str, str]:
    """The form Twilio posts to a voice webhook (the fields we read, and a few more)."""
    return {
        "AccountSid": "AC" + "0" * 32,
        "ApiVersion": "2010-04-01",
        "CallSid": call_sid,
        "CallStatus": "ringing",
        "Direction": "inbound",
        "From": caller,
        "To": callee,
    }


async def post_webhook(
    url: str,
    params: dict[str, str],
    signed_as: str | None = None,
    token: str = TWILIO_TOKEN,
    signature_of: dict[str, str] | None = None,
) -> WebhookAnswer:
    """POST the voice webhook with `params`, signed for the URL `signed_as` (default:
    `url`; "" = unsigned) over `signature_of` (default: `params`) under `token`."""
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    if signed_as != "":
        signed = params if signature_of is None else signature_of
        headers["X-Twilio-Signature"] = signature(signed_as or url, signed, token)
    body = urllib.parse.urlencode(params).encode()

    def post() -> WebhookAnswer:
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return WebhookAnswer(response.status, response.read().decode())
        except urllib.error.HTTPError as error:
            return WebhookAnswer(error.code, error.read().decode())

    return await asyncio.to_thread(post)


def new_call_sid() -> str:
    return "CA" + uuid.uuid4().hex


@dataclass
class Received:
    at: float
    message: dict[str, Any]


@dataclass
class TwilioClient:
    """Twilio's side of one Media Stream: the documented JSON messages in, and what
    the service sends recorded. Plays agent media out at real time like Twilio,
    echoing each mark once the audio sent before it has played (a `clear` drops the
    queued audio and echoes the marks still waiting at once, as Twilio does)."""

    url: str
    call_sid: str
    parameters: dict[str, str]
    stream_sid: str = field(default_factory=lambda: "MZ" + uuid.uuid4().hex)
    received: list[Received] = field(default_factory=list)
    marks_echoed: list[str] = field(default_factory=list)
    close_code: int | None = None
    _socket: Any = None
    _sequence: int = 0
    _chunk: int = 0
    _started_at: float = 0.0
    _played_until: float = 0.0
    _pending_marks: dict[str, asyncio.TimerHandle] = field(default_factory=dict)
    _reader: asyncio.Task[None] | None = None
    _echoes: set[asyncio.Task[None]] = field(default_factory=set)
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def connect(self) -> TwilioClient:
        self._socket = await websockets.connect(self.url)
        self._reader = asyncio.create_task(self._read())
        await self._send({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        return self

    async def start(self, **overrides: Any) -> None:
        start = {
            "accountSid": "AC" + "0" * 32,
            "streamSid": self.stream_sid,
            "callSid": self.call_sid,
            "tracks": ["inbound"],
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
            "customParameters": self.parameters,
            **overrides,
        }
        self._started_at = time.monotonic()
        await self._send({"event": "start", "start": start, "streamSid": self.stream_sid})

    async def media(self, payload: bytes) -> None:
        self._chunk += 1
        timestamp = round(1000 * (time.monotonic() - self._started_at))
        media = {
            "track": "inbound",
            "chunk": str(self._chunk),
            "timestamp": str(timestamp),
            "payload": base64.b64encode(payload).decode(),
        }
        await self._send({"event": "media", "media": media, "streamSid": self.stream_sid})

    async def speak(self, ulaw: bytes) -> None:
        """`ulaw` (8 kHz mu-law) as 20 ms media messages at real time."""
        await at_real_time(packets(ulaw, ULAW_PACKET, b"\xff"), self.media)

    async def silence(self, seconds: float) -> None:
        await self.speak(b"\xff" * round(8000 * seconds))

    async def dtmf(self, digit: str) -> None:
        dtmf = {"track": "inbound_track", "digit": digit}
        await self._send({"event": "dtmf", "streamSid": self.stream_sid, "dtmf": dtmf})

    async def send_raw(self, text: str) -> None:
        """`text` as a message as it is (a malformed one, say)."""
        await self._socket.send(text)

    async def stop(self) -> None:
        stop = {"accountSid": "AC" + "0" * 32, "callSid": self.call_sid}
        await self._send({"event": "stop", "streamSid": self.stream_sid, "stop": stop})

    async def close(self) -> None:
        for handle in self._pending_marks.values():
            handle.cancel()
        if self._socket is not None:
            await self._socket.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)

    async def _send(self, message: dict[str, Any]) -> None:
        if message["event"] != "connected":
            self._sequence += 1
            message = {"sequenceNumber": str(self._sequence), **message}
        await self._socket.send(json.dumps(message))

    async def _read(self) -> None:
        try:
            async for text in self._socket:
                message = json.loads(text)
                now = time.monotonic()
                self.received.append(Received(now, message))
                self._arrived.set()
                event = message["event"]
                if event == "media":
                    self._played_until = max(self._played_until, now) + PACKET_S
                elif event == "mark":
                    name = message["mark"]["name"]
                    delay = max(0.0, self._played_until - now)
                    loop = asyncio.get_running_loop()
                    self._pending_marks[name] = loop.call_later(delay, self._echo_mark, name)
                elif event == "clear":
                    self._played_until = now
                    for name, handle in list(self._pending_marks.items()):
                        handle.cancel()
                        self._echo_mark(name)
        except websockets.ConnectionClosed:
            pass
        finally:
            self.close_code = self._socket.close_code
            self._arrived.set()

    def _echo_mark(self, name: str) -> None:
        self._pending_marks.pop(name, None)
        self.marks_echoed.append(name)
        message = {"event": "mark", "streamSid": self.stream_sid, "mark": {"name": name}}
        echo = asyncio.ensure_future(self._send_quietly(message))
        self._echoes.add(echo)
        echo.add_done_callback(self._echoes.discard)

    async def _send_quietly(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            await self._send(message)

    def of(self, event: str) -> list[Received]:
        return [r for r in self.received if r.message["event"] == event]

    def agent_samples(self, after: float = 0.0) -> np.ndarray:
        """Agent audio that arrived after `after` (monotonic), as float samples at 8 kHz."""
        chunks = [r.message["media"]["payload"] for r in self.of("media") if r.at > after]
        return pcm16_to_float(mulaw_decode(b"".join(base64.b64decode(c) for c in chunks)))

    def speech_after(self, after: float) -> float:
        return speech_seconds(self.agent_samples(after))

    def speaking_now(self) -> bool:
        return speaking_at_end(self.agent_samples())

    def quiet_for(self, seconds: float) -> bool:
        return quiet_at_end(self.agent_samples(), seconds)

    def agent_audio(self) -> bytes:
        return b"".join(base64.b64decode(r.message["media"]["payload"]) for r in self.of("media"))

    @property
    def closed(self) -> bool:
        return self._reader is not None and self._reader.done()

    async def wait_for(
        self, what: Callable[[], bool], description: str, timeout_s: float = 10.0
    ) -> None:
        await wait_until(what, description, timeout_s)


async def twilio_call(
    server: TelephonyServer, call_sid: str | None = None, caller: str = "+15551230001"
) -> TwilioClient:
    """Twilio's part of a call: the signed webhook, then the stream its TwiML names."""
    call_sid = call_sid or new_call_sid()
    answer = await post_webhook(f"{server.url}twilio/voice", call_params(call_sid, caller))
    assert answer.status == 200, answer
    return await TwilioClient(answer.stream_url, call_sid, answer.parameters).connect()


# ---- AudioSocket -------------------------------------------------------------------------

AUDIO, HANG_UP, UUID_KIND, DTMF, ERROR = 0x10, 0x00, 0x01, 0x03, 0xFF


def as_packet(kind: int, payload: bytes = b"") -> bytes:
    return struct.pack("!BH", kind, len(payload)) + payload


@dataclass
class AudioSocketClient:
    """Asterisk's side of one AudioSocket call: packets out, packets in with their
    arrival times, EOF noticed."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    call_id: uuid.UUID = field(default_factory=uuid.uuid4)
    received: list[tuple[float, int, bytes]] = field(default_factory=list)
    eof: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    @classmethod
    async def connect(cls, port: int, host: str = "127.0.0.1") -> AudioSocketClient:
        reader, writer = await asyncio.open_connection(host, port)
        client = cls(reader, writer)
        client._task = asyncio.create_task(client._read())
        return client

    async def send(self, kind: int, payload: bytes = b"") -> None:
        self.writer.write(as_packet(kind, payload))
        await self.writer.drain()

    async def send_uuid(self) -> None:
        await self.send(UUID_KIND, self.call_id.bytes)

    async def audio(self, slin: bytes) -> None:
        await self.send(AUDIO, slin)

    async def speak(self, slin: bytes) -> None:
        await at_real_time(packets(slin, SLIN_PACKET, b"\x00"), self.audio)

    async def silence(self, seconds: float) -> None:
        await self.speak(b"\x00\x00" * round(8000 * seconds))

    async def _read(self) -> None:
        try:
            while True:
                kind, length = struct.unpack("!BH", await self.reader.readexactly(3))
                payload = await self.reader.readexactly(length)
                self.received.append((time.monotonic(), kind, payload))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.eof.set()

    def of(self, kind: int) -> list[tuple[float, bytes]]:
        return [(at, payload) for at, k, payload in self.received if k == kind]

    def agent_samples(self, after: float = 0.0) -> np.ndarray:
        """Agent audio that arrived after `after` (monotonic), as float samples at 8 kHz."""
        return pcm16_to_float(b"".join(p for at, p in self.of(AUDIO) if at > after))

    def kinds(self) -> list[int]:
        return [k for _, k, _ in self.received]

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)


def inter_arrival_ms(times: list[float]) -> list[float]:
    return [1000 * (b - a) for a, b in itertools.pairwise(times)]


def median(values: list[float]) -> float:
    return statistics.median(values)
