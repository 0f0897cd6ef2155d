"""The web service's one bridge: a client's WebSocket carried over one
Gateway.Converse call (kame_client's client), whatever the protocol.

The protocol is an adapter's (services/web/protocols/: the page, OpenAI
Realtime, Moshi): it turns the client's messages and the gateway's events
into Actions, without a network. Everything else is here, once:

- the call opens when the adapter says (the page and Moshi at once, Realtime
  with the first client event that needs one), with the config of then; its
  config goes first, audio and requests only once the session started, so
  that the client hears the gateway's own refusal (kame_client/client.py);
- uplink: the client's messages to the adapter, and what it asks of the call
  to the gateway: paced at real time (services/web/pacer.py, the one writer
  of the call) for protocols whose clients send audio as they like, or as
  they come (the page: a microphone paces it). The client's messages are
  read only once the call started when the session opens with one, so a
  caller the gateway refuses has nothing of theirs taken;
- downlink: the gateway's events to the adapter, then how the call ended
  (kame_client/status.py's CallEnd; CANCELLED, our own cancel: nobody to tell);
- admission (services/web/admission.py, the one rule for every protocol): a
  socket waits for its call to start (the gateway accepted its token) for at
  most `start_timeout_s` from its handshake, whatever it sends meanwhile (then
  the adapter's on_start_timeout closes it), and counts against
  `max_sessions` only once its call started; one started at the limit is
  ended, told as the adapter tells the gateway's RESOURCE_EXHAUSTED;
- idle: once the call is open, the adapter's `idle_timeout_s` counts from the
  caller's last audio with sound in it or text (services/web/activity.py),
  not from their last message: protocol chatter keeps no call alive;
- the end: the first of the client going away, the call ending, the adapter
  closing (a protocol error, the idle timeout, its timer) ends the session:
  every task is cancelled and waited for, the call cancelled, and the socket
  closed with the adapter's Close. A fault of ours is logged and told as the
  adapter's on_fault says; a client whose socket failed has gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import Protocol

import grpc

from kame_client.client import CallerRequest, ConverseClient
from kame_client.status import CallEnd
from kame_common.aio import cancel_and_wait, wait_first
from services.web.activity import PCM16, caller_active
from services.web.admission import Admission, Ticket
from services.web.config import WebSettings
from services.web.pacer import Pacer
from services.web.protocols.adapter import Actions, Adapter, Close, OpenCall, Timer

log = logging.getLogger(__name__)
RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED


class ClientSocket(Protocol):
    """The client's end of the bridge: a WebSocket, or a test's stand-in."""

    async def receive(self) -> str | bytes | None:
        """The next message; None once the client has gone."""

    async def send_text(self, text: str) -> None: ...

    async def send_bytes(self, data: bytes) -> None: ...


class Bridge:
    """Carries client sockets over calls to the gateway named in the settings."""

    def __init__(self, settings: WebSettings, admission: Admission) -> None:
        self.settings = settings
        self.admission = admission

    async def run(
        self, socket: ClientSocket, adapter: Adapter, token: str, ticket: Ticket
    ) -> Close:
        """One session of the socket `ticket` admitted, until it ends: how to close it."""
        try:
            return await Session(self, socket, adapter, token, ticket).run()
        finally:
            self.admission.leave(ticket)


class Session:
    """One client socket, its adapter and, once opened, its gateway call."""

    def __init__(
        self, bridge: Bridge, socket: ClientSocket, adapter: Adapter, token: str, ticket: Ticket
    ) -> None:
        self.settings = bridge.settings
        self.admission = bridge.admission
        self.ticket = ticket
        self.socket = socket
        self.adapter = adapter
        self.token = token
        self.client: ConverseClient | None = None
        self.pacer: Pacer | None = None
        self.call: asyncio.Future[None] | None = None
        self.timer: asyncio.Future[None] | None = None
        self.over = asyncio.Event()  # the session ends (the call's end or a Close)
        self.close: Close | None = None
        self.client_gone = False  # a send failed: the socket takes no more
        self._sending = asyncio.Lock()  # the reader and the call both send
        self.heard_at = asyncio.get_running_loop().time()  # the caller's last sound or text
        self._receiving: asyncio.Timeout | None = None  # the reader's wait for a message

    async def run(self) -> Close:
        reader: asyncio.Future[None] | None = None
        watch = asyncio.ensure_future(self._watch_start())
        try:
            await self.apply(self.adapter.opening())
            reader = asyncio.ensure_future(self._read_client())
            await wait_first(reader, self.over)
            if reader.done():
                reader.result()  # the reader's own fault, if it failed
        except Exception as exc:
            await self._failed(exc)
        finally:
            # The call first: a pacer whose cancel Python 3.11's wait_for dropped (it
            # comes as audio arrives) then stops at its next send.
            if self.client is not None:
                self.client.cancel()
            tasks = (reader, self.call, self.timer, watch)
            await cancel_and_wait([t for t in tasks if t is not None])
            if self.client is not None:
                await self.client.close()
        return self.close or Close()

    async def apply(self, actions: Actions) -> None:
        """Carry out what the adapter asked for (Actions says in which order)."""
        await self._send(actions.send)
        if actions.open_call is not None and self.client is None:
            self._open_call(actions.open_call)
        if actions.clear_audio and self.pacer is not None:
            self.pacer.clear()
        if actions.audio:
            await self._take_audio(actions.audio)
        for request in actions.requests:
            await self._request(request)
        if actions.disarm or actions.timer is not None:
            self._set_timer(actions.timer)
        if actions.close is not None:
            self._end(actions.close)

    def _end(self, close: Close) -> None:
        self.close = self.close or close
        self.over.set()

    async def _send(self, messages: list[str | bytes]) -> None:
        async with self._sending:
            for message in messages:
                try:
                    if isinstance(message, str):
                        await self.socket.send_text(message)
                    else:
                        await self.socket.send_bytes(message)
                except Exception:
                    self.client_gone = True  # whatever the socket raised
                    raise

    async def _read_client(self) -> None:
        """The client's messages to the adapter until the client goes, the
        adapter closes, or the caller is idle (no sound, no text) for the
        adapter's idle time once the call started."""
        if self.client is not None:  # the session opened with its call
            assert self.call is not None
            await self.client.wait_started(self.call)
        loop = asyncio.get_running_loop()
        while not self.over.is_set():
            try:
                async with asyncio.timeout_at(self._deadline()) as self._receiving:
                    raw = await self.socket.receive()
            except TimeoutError:
                self._receiving = None
                await self.apply(self.adapter.on_idle())
                return
            self._receiving = None
            if raw is None:
                return  # the client went away: nobody to tell
            actions = self.adapter.on_client(raw)
            if caller_active(actions, self.pacer.coding if self.pacer else PCM16):
                self.heard_at = loop.time()
            await self.apply(actions)

    def _deadline(self) -> float | None:
        """When the caller's idle time runs out (None: never; before the call
        started, _watch_start's deadline is the one)."""
        idle_s = self.adapter.idle_timeout_s
        return None if idle_s is None or not self.ticket.counted else self.heard_at + idle_s

    async def _watch_start(self) -> None:
        """The session ends if its call has not started (been admitted) by
        start_timeout_s after the handshake, whatever the client sends meanwhile."""
        timeout_s = self.settings.start_timeout_s
        await asyncio.sleep(self.ticket.opened_at + timeout_s - asyncio.get_running_loop().time())
        if not self.ticket.counted:
            await self.apply(self.adapter.on_start_timeout(timeout_s))
            self._end(Close())

    async def _admitted(self) -> bool:
        """The call started: it counts against max_sessions from now, or, the web
        service at its limit, the client is told so as the gateway's busy."""
        if refusal := self.admission.admit(self.ticket):
            await self.apply(self.adapter.on_call_end(CallEnd(RESOURCE_EXHAUSTED, refusal)))
            return False
        self.heard_at = asyncio.get_running_loop().time()  # idle counts from the start
        if self._receiving is not None:  # the reader waits for a message: from now, not forever
            self._receiving.reschedule(self._deadline())
        return True

    async def _take_audio(self, audio: bytes) -> None:
        """Caller audio to the call: paced, if it fits the backlog; or at once."""
        if self.pacer is not None:
            if self.pacer.has_room(self.pacer.coding.seconds(audio)):
                self.pacer.push(audio)
            else:
                await self.apply(self.adapter.on_backlog_full())
        elif self.client is not None:
            await self.client.send_audio(audio)  # False once over: the downlink says how

    async def _request(self, request: CallerRequest) -> None:
        """A request for the call (none open: nothing to ask, a cancel of a call
        never made); paced ones after the audio pushed before them."""
        if self.pacer is not None:
            assert self.client is not None
            self.pacer.push_request(functools.partial(self.client.perform, request), request.URGENT)
        elif self.client is not None:
            await self.client.perform(request)

    def _set_timer(self, timer: Timer | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = None if timer is None else asyncio.ensure_future(self._expire(timer))

    async def _expire(self, timer: Timer) -> None:
        await asyncio.sleep(timer.seconds)
        self.timer = None  # it is this task: not cancelled by the actions it applies
        try:
            await self.apply(timer.then)
        finally:
            self._end(timer.then.close or Close())

    def _open_call(self, call: OpenCall) -> None:
        channel = self.settings.gateway_channel(self.settings.connection_policy())
        self.client = ConverseClient(channel, self.token, own_channel=True)
        if call.paced is not None:
            self.pacer = Pacer(call.paced, self.client.send_audio, fill_silence=call.fill_silence)
        self.call = asyncio.ensure_future(self._call(self.client, call))

    async def _call(self, client: ConverseClient, call: OpenCall) -> None:
        """The config, the paced audio once the session started, and the gateway's
        events to the adapter until the call ends, or a fault of ours ends it."""
        downlink = asyncio.ensure_future(self._downlink(client))
        pacing: asyncio.Future[None] | None = None
        try:
            await client.start(call.config)
            await client.wait_started(downlink)
            if client.started.is_set() and not await self._admitted():
                return
            if self.pacer is not None:
                pacing = asyncio.ensure_future(self.pacer.run())
                await wait_first(downlink, pacing)
                if pacing.done():  # the call is over, or the pacer failed
                    pacing.result()
            await downlink
        except Exception as exc:
            await self._failed(exc)
        finally:
            await cancel_and_wait([downlink, *([pacing] if pacing else [])])
            self._end(Close())

    async def _downlink(self, client: ConverseClient) -> None:
        end = None
        try:
            async for event in client.events():
                await self.apply(self.adapter.on_event(event))
        except grpc.aio.AioRpcError as exc:
            end = CallEnd.of(exc, client.channel)
            if end.cancelled:
                return  # the client went away: nobody to tell
            log.info("%s: the call ended: %s", self.adapter.name, end.summary())
        await self.apply(self.adapter.on_call_end(end))

    async def _failed(self, exc: Exception) -> None:
        """A fault of ours (a bug: the gateway ending the call is the downlink's)
        ends the session: logged, and the client told as the adapter says. A
        client whose socket failed has gone: nobody to tell."""
        if self.client_gone:
            log.info("%s ended: the client went away (%r)", self.adapter.name, exc)
        else:
            log.error("%s failed", self.adapter.name, exc_info=exc)
            with contextlib.suppress(Exception):  # the socket failed too: nobody to tell
                await self.apply(self.adapter.on_fault())
        self._end(Close())
