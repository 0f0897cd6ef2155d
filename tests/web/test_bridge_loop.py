"""The web service's one bridge (services/web/bridge.py), whatever the protocol:
a recording adapter on a socket stand-in, over a real gateway in front of the
scripted upstreams (tests/gateway/fakes.py). The client is read only once the
call started; the call's end, the client going away, an idle client, the
adapter's timer and a fault of ours each end the session as the adapter says."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import grpc
import pytest

from kame_client.events import AgentAudio, ConverseEvent, Started
from kame_client.status import CallEnd, CloseCode
from kamepb import gateway_pb2
from services.web.admission import Admission
from services.web.bridge import Bridge
from services.web.config import WebSettings
from services.web.protocols.adapter import Actions, Close, OpenCall, Timer
from services.web.protocols.realtime_config import CODINGS
from tests.support import wait_until

PCM = CODINGS["audio/pcm"]
FRAME = bytes(2 * 1920)  # 80 ms of PCM16 at 24 kHz
TOKEN = "bridge-test-token-0123456789"


class QueueSocket:
    """The client's socket: what the test puts in `incoming` is received (None:
    the client goes away); what the bridge sends is kept in `sent`."""

    def __init__(self) -> None:
        self.incoming: asyncio.Queue[str | bytes | None] = asyncio.Queue()
        self.sent: list[str | bytes] = []

    async def receive(self) -> str | bytes | None:
        return await self.incoming.get()

    async def send_text(self, text: str) -> None:
        self.sent.append(text)

    async def send_bytes(self, data: bytes) -> None:
        self.sent.append(data)


@dataclass
class Recorder:
    """An adapter that opens the call at once and records what it is given, in order."""

    paced: bool = True
    idle_timeout_s: float | None = None
    timer: Timer | None = None  # armed at the session's start
    fail_on_client: bool = False
    seen: list[object] = field(default_factory=list)
    name: str = "test session"

    def opening(self) -> Actions:
        audio = PCM.gateway_format()
        config = gateway_pb2.ConverseConfig(input_format=audio, output_format=audio)
        call = OpenCall(config, PCM if self.paced else None)
        return Actions(send=["hello"], open_call=call, timer=self.timer)

    def on_client(self, message: str | bytes) -> Actions:
        if self.fail_on_client:
            raise RuntimeError("a bug")
        self.seen.append(message)
        if message == "disarm":
            return Actions(disarm=True)
        return Actions(audio=message) if isinstance(message, bytes) else Actions()

    def on_event(self, event: ConverseEvent) -> Actions:
        if not isinstance(event, AgentAudio):
            self.seen.append(event)
        return Actions()

    def on_call_end(self, end: CallEnd | None) -> Actions:
        self.seen.append(end)
        return Actions(send=["call over"], close=Close(CloseCode.TRY_AGAIN_LATER, "over"))

    def on_backlog_full(self) -> Actions:
        return Actions(send=["backlog full"])

    def on_idle(self) -> Actions:
        return Actions(send=["idle"], close=Close(CloseCode.POLICY_VIOLATION, "idle"))

    def on_start_timeout(self, timeout_s: float) -> Actions:
        return Actions(send=["no call"], close=Close(CloseCode.POLICY_VIOLATION, "no call"))

    def on_fault(self) -> Actions:
        return Actions(send=["fault"], close=Close(CloseCode.INTERNAL_ERROR, "fault"))


async def bridged(
    gateway_address: str,
    adapter: Recorder,
    socket: QueueSocket,
    token: str = "",
    admission: Admission | None = None,
    **settings: object,
) -> Close:
    web = WebSettings(gateway_address=gateway_address)
    for name, value in settings.items():
        setattr(web, name, value)
    admission = admission or Admission(web.max_sessions, 0)
    bridge = Bridge(web, admission)
    ticket = admission.arrive("a")
    assert ticket is not None
    return await asyncio.wait_for(bridge.run(socket, adapter, token, ticket), 20)


async def test_the_client_is_read_once_the_call_started_and_its_audio_reaches_the_gateway(fakes):
    gateway = await fakes.gateway()
    socket, adapter = QueueSocket(), Recorder(paced=False)
    for _ in range(3):
        socket.incoming.put_nowait(FRAME)  # sent at once, before any session
    session = asyncio.ensure_future(bridged(gateway.address, adapter, socket))
    await wait_until(lambda: len(fakes.frontend.log.of("audio")) >= 3, "the caller's audio", 10)
    socket.incoming.put_nowait(None)
    close = await session
    assert isinstance(adapter.seen[0], Started), adapter.seen  # before any client message
    assert adapter.seen[1:4] == [FRAME] * 3
    assert close == Close(), "the client went away: nobody to tell"
    assert socket.sent[0] == "hello"
    await wait_until(lambda: gateway.active_sessions == 0, "the call cancelled", 10)


async def test_a_refused_call_ends_the_session_and_nothing_of_the_clients_is_read(fakes):
    gateway = await fakes.gateway(auth_tokens=TOKEN)
    socket, adapter = QueueSocket(), Recorder()
    socket.incoming.put_nowait(FRAME)
    close = await bridged(gateway.address, adapter, socket, token="wrong-token-0123456789")
    [end] = adapter.seen
    assert isinstance(end, CallEnd) and end.code == grpc.StatusCode.UNAUTHENTICATED
    assert end.message().startswith("auth refused")
    assert (close.code, socket.sent[-1]) == (CloseCode.TRY_AGAIN_LATER, "call over")
    assert socket.incoming.qsize() == 1, "the client's audio was never read"


async def test_a_client_silent_for_the_adapters_idle_time_is_told_and_closed(fakes):
    gateway = await fakes.gateway()
    socket, adapter = QueueSocket(), Recorder(idle_timeout_s=0.3)
    close = await bridged(gateway.address, adapter, socket)
    assert (close.code, socket.sent[-1]) == (CloseCode.POLICY_VIOLATION, "idle")
    await wait_until(lambda: gateway.active_sessions == 0, "the call cancelled", 10)


@pytest.mark.parametrize("disarmed", [False, True])
async def test_the_adapters_timer_ends_the_session_unless_disarmed(fakes, disarmed):
    gateway = await fakes.gateway()
    expired = Actions(send=["too late"], close=Close(CloseCode.POLICY_VIOLATION, "late"))
    socket, adapter = QueueSocket(), Recorder(timer=Timer(0.5, expired))
    if disarmed:
        socket.incoming.put_nowait("disarm")
    session = asyncio.ensure_future(bridged(gateway.address, adapter, socket))
    await asyncio.sleep(1.0)
    assert session.done() != disarmed
    socket.incoming.put_nowait(None)
    close = await session
    if disarmed:
        assert close == Close() and "too late" not in socket.sent
    else:
        assert (close.code, socket.sent[-1]) == (CloseCode.POLICY_VIOLATION, "too late")


async def test_the_call_ending_ends_the_session_as_the_adapter_says(fakes):
    gateway = await fakes.gateway(max_session_s=0.5)
    socket, adapter = QueueSocket(), Recorder(paced=True)
    close = await bridged(gateway.address, adapter, socket)  # the pacer feeds silence
    end = adapter.seen[-1]
    assert isinstance(end, CallEnd) and end.code == grpc.StatusCode.OUT_OF_RANGE
    assert (close.code, socket.sent[-1]) == (CloseCode.TRY_AGAIN_LATER, "call over")


async def test_a_fault_of_ours_is_logged_and_told_as_the_adapter_says(fakes, caplog):
    gateway = await fakes.gateway()
    socket, adapter = QueueSocket(), Recorder(fail_on_client=True)
    socket.incoming.put_nowait(FRAME)
    with caplog.at_level(logging.ERROR):
        close = await bridged(gateway.address, adapter, socket)
    assert (close.code, socket.sent[-1]) == (CloseCode.INTERNAL_ERROR, "fault")
    assert "test session failed" in caplog.text and "RuntimeError: a bug" in caplog.text
    await wait_until(lambda: gateway.active_sessions == 0, "the call cancelled", 10)
