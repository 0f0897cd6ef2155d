"""Asterisk AudioSocket: a PBX's calls over TCP, each bridged to a Converse call.

Asterisk's res_audiosocket (the `AudioSocket()` dialplan application, or a
`Dial(AudioSocket/host:port/uuid)` channel) connects once per call and speaks
packets of one kind byte, a 2-byte big-endian payload length and the payload:

    0x00  hang-up          no payload; either side ends the call
    0x01  UUID             16 bytes, the call's id; always the first packet
    0x03  DTMF             1 ASCII byte, a key the caller pressed
    0x10  audio            signed linear 16-bit little-endian mono 8 kHz (slin),
                           320 bytes per 20 ms
    0xff  error            1 byte, Asterisk's error code

Only peers in allowed_networks may connect (others are closed at once,
unanswered); a replica that is draining or at max_sessions answers a hang-up.
Agent audio goes back as 0x10 packets, one per 20 ms on the PhoneCall's
Playout clock (Asterisk plays what it receives as it comes, so pacing is ours).
Anything else (an unknown kind, a payload that does not fit its kind, no UUID
first) is a broken peer: logged, counted as a "protocol" refusal, closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import struct
import uuid

from services.telephony.call import CallInfo, PhoneCall
from services.telephony.call_control import CallControlError
from services.telephony.playout import SLIN
from services.telephony.service import Telephony

log = logging.getLogger(__name__)

PROVIDER = "audiosocket"
HEADER = struct.Struct("!BH")
# The longest audio payload taken: a second of slin (Asterisk sends 20 ms).
MAX_AUDIO_BYTES = 16_000
# Asterisk sends the UUID as soon as it connects.
UUID_TIMEOUT_S = 5.0
# How long stop() waits for open calls to hang up before cutting them off.
STOP_TIMEOUT_S = 5.0


class Kind(enum.IntEnum):
    HANG_UP = 0x00
    UUID = 0x01
    DTMF = 0x03
    AUDIO = 0x10
    ERROR = 0xFF


# Payload sizes each kind must have (audio: checked apart).
FIXED_SIZES = {Kind.HANG_UP: 0, Kind.UUID: 16, Kind.DTMF: 1}


class ProtocolError(Exception):
    """The peer does not speak AudioSocket as Asterisk does; says how."""


def packet(kind: Kind, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, len(payload)) + payload


async def read_packet(reader: asyncio.StreamReader) -> tuple[Kind, bytes]:
    """The next packet. IncompleteReadError at EOF; ProtocolError for a bad one."""
    raw_kind, length = HEADER.unpack(await reader.readexactly(HEADER.size))
    try:
        kind = Kind(raw_kind)
    except ValueError:
        hint = " (audio at another rate than 8 kHz slin?)" if 0x11 <= raw_kind <= 0x18 else ""
        raise ProtocolError(f"unknown packet kind 0x{raw_kind:02x}{hint}") from None
    if kind == Kind.AUDIO and (length > MAX_AUDIO_BYTES or length % 2):
        raise ProtocolError(
            f"audio packet of {length} bytes (slin: even, at most {MAX_AUDIO_BYTES})"
        )
    if kind in FIXED_SIZES and length != FIXED_SIZES[kind]:
        raise ProtocolError(f"{kind.name} packet of {length} bytes, expected {FIXED_SIZES[kind]}")
    if kind == Kind.ERROR and length > 16:
        raise ProtocolError(f"error packet of {length} bytes")
    return kind, await reader.readexactly(length)


class AudioSocketCall:
    """One AudioSocket connection, and the PhoneLeg of its call."""

    def __init__(
        self, telephony: Telephony, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.telephony = telephony
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.peer_ip = peer[0] if peer else ""
        self.call_id = ""
        self.call: PhoneCall | None = None
        self._closed = False

    async def run(self) -> None:
        try:
            if reason := self.telephony.admit(PROVIDER, self.peer_ip):
                log.warning("audiosocket: %s refused: %s", self.peer, reason)
                if reason != "network":  # strangers get nothing; a PBX hears the refusal
                    await self._send(packet(Kind.HANG_UP))
                return
            try:
                await self._run_admitted()
            finally:
                self.telephony.release()
        finally:
            await self._close()

    async def _run_admitted(self) -> None:
        """The call from its UUID to its end; a slot is held meanwhile (admit())."""
        try:
            self.call = await self._admit()
        except (asyncio.IncompleteReadError, ConnectionError):
            log.info("audiosocket: %s closed before its UUID", self.peer)
            return
        except ProtocolError as exc:
            self._protocol_error(str(exc))
            return
        except TimeoutError:
            self._protocol_error(f"no UUID packet within {UUID_TIMEOUT_S:g} s")
            return
        reader = asyncio.ensure_future(self._read(self.call))
        try:
            # Ended on our side (the gateway, or the service stopping), the call's
            # run() hangs up the phone: hang_up() below.
            await self.telephony.run(self.call)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _admit(self) -> PhoneCall:
        kind, payload = await asyncio.wait_for(read_packet(self.reader), UUID_TIMEOUT_S)
        if kind != Kind.UUID:
            raise ProtocolError(f"first packet is {kind.name}, not UUID")
        self.call_id = str(uuid.UUID(bytes=payload))
        log.info("audiosocket: call %s from %s", self.call_id, self.peer)
        info = CallInfo(PROVIDER, provider_call_id=self.call_id)
        return self.telephony.new_call(info, SLIN, self)

    async def _read(self, call: PhoneCall) -> None:
        """Asterisk's packets into the call until a hang-up, an error or EOF."""
        try:
            while True:
                kind, payload = await read_packet(self.reader)
                if kind == Kind.AUDIO:
                    call.caller_audio(payload)
                elif kind == Kind.DTMF:
                    call.caller_dtmf(payload.decode("ascii", "replace"))
                elif kind == Kind.HANG_UP:
                    log.info("audiosocket: call %s: hang-up from %s", self.call_id, self.peer)
                    break
                elif kind == Kind.ERROR:
                    code = payload[0] if payload else -1
                    log.warning("audiosocket: call %s: Asterisk error code %d", self.call_id, code)
                    break
                else:
                    raise ProtocolError("a second UUID packet mid-call")
        except (asyncio.IncompleteReadError, ConnectionError):
            log.info("audiosocket: call %s: %s closed the connection", self.call_id, self.peer)
        except ProtocolError as exc:
            self._protocol_error(str(exc))
        call.caller_hung_up()

    def _protocol_error(self, why: str) -> None:
        self.telephony.refused(PROVIDER, "protocol")
        log.warning("audiosocket: %s (call %s): %s: closing", self.peer, self.call_id or "?", why)
        self._abort()

    # ---- PhoneLeg --------------------------------------------------------------

    async def send_audio(self, packet_bytes: bytes, speaking: bool) -> None:
        await self._send(packet(Kind.AUDIO, packet_bytes))

    async def clear(self) -> None:
        """Nothing to clear: Asterisk plays packets as they come, and ours are paced."""

    async def hang_up(self, reason: str) -> None:
        log.info("audiosocket: call %s: hanging up: %s", self.call_id, reason)
        await self._send(packet(Kind.HANG_UP))
        await self._close()

    # ---- call control (services/telephony/call_control.py) ------------------------

    async def transfer(self, target_uri: str) -> str:
        raise CallControlError(
            "AudioSocket calls cannot be transferred: the protocol has audio, keys and "
            "hang-up only (the dialplan after AudioSocket() can Dial())"
        )

    async def send_dtmf(self, digits: str) -> None:
        raise CallControlError(
            "AudioSocket calls cannot send keys: the protocol carries keys from Asterisk only"
        )

    async def _send(self, data: bytes) -> None:
        if self._closed or self.writer.is_closing():
            return
        self.writer.write(data)
        with contextlib.suppress(ConnectionError):
            await self.writer.drain()

    def _abort(self) -> None:
        self._closed = True
        self.writer.close()

    async def _close(self) -> None:
        self._closed = True
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


class AudioSocketServer:
    def __init__(self, telephony: Telephony) -> None:
        self.telephony = telephony
        self.port = 0
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], AudioSocketCall] = {}

    async def start(self) -> None:
        settings = self.telephony.settings
        self._server = await asyncio.start_server(
            self._connected, settings.host, settings.audiosocket_port
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        connection = AudioSocketCall(self.telephony, reader, writer)
        self._connections[task] = connection
        try:
            await connection.run()
        finally:
            self._connections.pop(task, None)

    async def stop(self) -> None:
        """No new connections; the open ones are hung up (Telephony.hang_up_all ends
        their calls first when the whole service stops)."""
        if self._server is not None:
            self._server.close()
        for connection in self._connections.values():
            if connection.call is not None:
                connection.call.hang_up("the AudioSocket server is stopping")
        tasks = list(self._connections)
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=STOP_TIMEOUT_S)
            for task in late:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
