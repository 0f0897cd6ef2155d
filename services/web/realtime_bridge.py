"""A Realtime WebSocket (services/web/realtime.py's protocol) carried over one
Gateway.Converse call (kame_client/client.py).

The call opens with the first client event that needs it (an append, a
commit, a typed message, response.create), with the formats, voice, turn
detection and instructions the session has then (session.update may set them
before). The caller's audio goes to the gateway through a `Pacer`
(services/web/pacer.py): at real time, whatever pace the client appends at.
The client's other requests (end_turn, respond, send_text, a function's
output) go in the same stream, after the audio appended before them; a cancel
goes at once. A fault of the endpoint's own (not the gateway ending the
call) is logged and sent as the protocol's `server_error`, and the session
ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging

import grpc

from kame_client.client import ConverseClient
from kame_client.status import CallEnd
from kame_common.aio import cancel_and_wait, wait_first
from kame_common.words import parse_phrases
from services.web import bridge
from services.web.bridge import PageSocket
from services.web.config import WebSettings
from services.web.pacer import MAX_BACKLOG_S, GatewayCall, Pacer
from services.web.realtime import GatewayRequest, RealtimeSession, Reply, lone_error
from services.web.realtime_config import ClientError, Event, error_event

log = logging.getLogger(__name__)

# The largest WebSocket message the web service takes (server.py): OpenAI takes
# 15 MiB, so a client's oversize append reaches the session and is refused
# there with the protocol's error, the socket open; beyond this the socket closes (1009).
MAX_MESSAGE_BYTES = 16 << 20


def gateway_call(client: ConverseClient, request: GatewayRequest) -> GatewayCall:
    """The ConverseClient call `request` names."""
    if request.action == "send_text":
        return functools.partial(client.send_text, request.text)
    if request.action == "send_function_result":
        return functools.partial(client.send_function_result, request.call_id, request.text)
    calls = {
        "end_turn": client.end_turn,
        "respond": client.respond,
        "cancel_response": client.cancel_response,
    }
    return calls[request.action]


def bearer_token(authorization: str | None) -> str:
    """The token of an `Authorization: Bearer <token>` header ("" if none)."""
    scheme, _, token = (authorization or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def call_error(end: CallEnd) -> Event:
    """How the gateway ended the call, as the protocol's error (kame_client.status's words)."""
    return error_event(end.name.lower(), end.message(), end.error_type)


class RealtimeBridge:
    """Carries Realtime sockets over calls to the gateway named in the settings."""

    def __init__(self, settings: WebSettings) -> None:
        self.settings = settings

    async def run(self, socket: PageSocket, model: str, token: str) -> None:
        """One session: client events until the client goes or the gateway ends
        the call. A model the web service does not offer: an error, and no session."""
        try:
            session = RealtimeSession(
                model,
                self.settings.mode_choices,
                self.settings.realtime_relay_instructions,
                parse_phrases(self.settings.backchannel_phrases),
            )
        except ClientError as exc:
            await bridge.send_json(socket, lone_error(exc.code, exc.message))
            return
        link = RealtimeLink(self.settings, socket, session, token)
        await link.send(session.opening())
        try:
            await link.run()
        finally:
            await link.close()


class RealtimeLink:
    """One Realtime socket and, once audio flows, its gateway call."""

    def __init__(
        self, settings: WebSettings, socket: PageSocket, session: RealtimeSession, token: str
    ) -> None:
        self.settings = settings
        self.socket = socket
        self.session = session
        self.token = token
        self.pacer: Pacer | None = None
        self.client: ConverseClient | None = None
        self.call: asyncio.Future[None] | None = None
        self.call_over = asyncio.Event()
        self.client_gone = False  # a send failed: the socket takes no more
        self._sending = asyncio.Lock()

    async def send(self, events: list[Event]) -> None:
        async with self._sending:  # the reader and the call both answer
            for event in events:
                try:
                    await bridge.send_json(self.socket, event)
                except Exception:
                    self.client_gone = True  # whatever the socket raised
                    raise

    async def run(self) -> None:
        """Until the client goes or the call is over."""
        reader = asyncio.ensure_future(self._read_client())
        try:
            await wait_first(reader, self.call_over)
            if reader.done():
                reader.result()  # the reader's own fault, if it failed
        except Exception as exc:
            await self._failed(exc)
        finally:
            await cancel_and_wait([reader])

    async def _failed(self, exc: Exception) -> None:
        """A fault of the endpoint's own (a bug: the gateway ending the call is
        _downlink's) ends the session: logged, and the client told with the
        protocol's server_error, as OpenAI reports one of its own, before the
        socket closes. A client whose socket failed has gone: nobody to tell."""
        session_id = self.session.id
        if self.client_gone:
            log.info("realtime session %s ended: the client went away (%r)", session_id, exc)
            return
        log.error("realtime session %s failed", session_id, exc_info=exc)
        message = (
            "The server had an error while processing your request, and the session ends "
            f"(session {session_id} in the web service's log)."
        )
        error = error_event("server_error", message, "server_error")
        with contextlib.suppress(Exception):  # the socket failed too: nobody to tell
            await self.send(self.session.on_call_end(error))

    async def _read_client(self) -> None:
        """Until the client goes, or sends nothing for `realtime_idle_timeout_s`:
        then an error says so and the session ends (the socket would otherwise
        hold a web service slot, and once audio flowed a gateway call fed with
        silence, for as long as the client kept it open)."""
        idle_s = self.settings.realtime_idle_timeout_s
        while True:
            try:
                async with asyncio.timeout(idle_s):
                    raw = await self.socket.receive()
            except TimeoutError:
                message = f"no client event for {idle_s:g} s: the session ends"
                await self.send(self.session.stamp([error_event("idle_timeout", message)]))
                return
            if raw is None:
                return
            reply = self.session.on_client(raw)
            await self.send([*reply.events, *self._to_gateway(reply)])

    def _to_gateway(self, reply: Reply) -> list[Event]:
        """`reply`'s audio and requests to the call (opened if it needs one); the
        error events of audio that cannot wait."""
        if reply.needs_call and self.pacer is None:
            self._open_call()
        if self.pacer is None or self.client is None:
            return []  # a cancel with no call: the agent is not speaking
        if reply.clear_audio:
            self.pacer.clear()
        errors = []
        if reply.audio and not self.pacer.has_room(self.pacer.coding.seconds(reply.audio)):
            message = (
                f"more than {MAX_BACKLOG_S:g} s of audio waits to be sent; append at real time"
            )
            errors = self.session.stamp([error_event("input_audio_buffer_full", message)])
        elif reply.audio:
            self.pacer.push(reply.audio)
        for request in reply.requests:
            self.pacer.push_request(gateway_call(self.client, request), request.urgent)
        return errors

    def _open_call(self) -> None:
        channel = self.settings.gateway_channel(self.settings.connection_policy())
        self.client = ConverseClient(channel, self.token, own_channel=True)
        self.pacer = Pacer(self.session.config.input, self.client.send_audio)
        self.call = asyncio.ensure_future(self._call(self.client, self.pacer))

    async def _call(self, client: ConverseClient, pacer: Pacer) -> None:
        """The config, the paced audio once the session started, and the gateway's
        events to the client until the call ends, or a fault of ours ends it."""
        downlink = asyncio.ensure_future(self._downlink(client))
        pacing: asyncio.Future[None] | None = None
        try:
            await client.start(self.session.config.converse_config(self.session.mode))
            # Audio only once started: the client then hears the gateway's own refusal.
            await client.wait_started(downlink)
            pacing = asyncio.ensure_future(pacer.run())
            await wait_first(downlink, pacing)
            if pacing.done():  # the call is over, or the pacer failed
                pacing.result()
            await downlink
        except Exception as exc:
            await self._failed(exc)
        finally:
            await cancel_and_wait([downlink, *([pacing] if pacing else [])])
            self.call_over.set()

    async def _downlink(self, client: ConverseClient) -> None:
        error = None
        try:
            async for event in client.events():
                await self.send(self.session.on_converse(event))
        except grpc.aio.AioRpcError as exc:
            end = CallEnd.of(exc, client.channel)
            if end.cancelled:
                return  # the client went away: nobody to tell
            log.info("realtime call ended: %s", end.summary())
            error = call_error(end)
        await self.send(self.session.on_call_end(error))

    async def close(self) -> None:
        if self.call is not None:
            await cancel_and_wait([self.call])
        if self.client is not None:
            await self.client.close()
