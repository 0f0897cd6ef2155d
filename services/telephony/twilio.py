"""Twilio Media Streams: a Twilio number's calls, bridged to Converse calls.

Twilio asks the TwiML webhook (POST /twilio/voice) what to do with a call. The
request is signed (X-Twilio-Signature, an HMAC of the URL and the form under
the account's auth token): a request without a valid signature, or any request
while no auth token is configured, gets 403. A signed one gets

    <Response><Connect><Stream url="wss://HOST/twilio/stream">
      <Parameter name="from" .../> <Parameter name="to" .../>
      <Parameter name="call_sid" .../> <Parameter name="token" .../>
    </Stream></Connect></Response>

and Twilio opens a WebSocket to that URL carrying the call's audio both ways
(8 kHz mu-law, 20 ms per `media` message). The upgrade itself carries nothing
we can check, so the webhook hands out a token: an HMAC (auth token as key) of
the CallSid, the numbers and an expiry, returned by Twilio in the `start`
message's customParameters. A stream whose token does not verify for its
`start.callSid` is closed before any Converse call: only streams our webhook
handed out are bridged. A token is good for one stream, and a CallSid has one
live stream at a time (StreamClaims, per replica). A message that is not what
Media Streams sends (not JSON, a field of the wrong type, a payload that is not
base64) closes the stream with a log line.

On the stream, inbound: `connected`, `start`, `media` (caller audio), `dtmf`,
`mark` (Twilio echoes a mark of ours once the audio sent before it has been
played), `stop`. Outbound: `media` (one per 20 ms packet, paced by the
PhoneCall's Playout), a `mark` after each stretch of agent speech (its echo
measures how long Twilio held our audio before playing it), `clear` on a
barge-in (Twilio drops the audio it has queued). The agent's side ending the
call closes the WebSocket, which ends the <Connect> and so the call.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import re
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from starlette.datastructures import ImmutableMultiDict
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState
from twilio.request_validator import (
    SIGNATURE_SETTINGS_HEADER,
    RequestValidator,
    get_signature_algorithm,
)
from twilio.twiml.voice_response import Connect, VoiceResponse

from kame_common.auth import same_signature, sign
from services.telephony import metrics
from services.telephony.call import CallInfo, PhoneCall
from services.telephony.call_control import CallControlError
from services.telephony.config import TelephonySettings
from services.telephony.playout import PCMU
from services.telephony.service import Telephony
from services.telephony.twilio_transfer import (
    AFTER_ACTION,
    AFTER_PATH,
    Transfers,
    dial_twiml,
    hangup_twiml,
)

log = logging.getLogger(__name__)

PROVIDER = "twilio"
VOICE_PATH = "/twilio/voice"
STREAM_PATH = "/twilio/stream"
# A stream must start within this long of the webhook that handed out its token
# (Twilio opens it at once; a replayed token is useless after this).
TOKEN_TTL_S = 300
# Twilio sends `connected` and `start` as soon as the socket opens.
START_TIMEOUT_S = 10.0
# WebSocket close codes: policy violation (refused), normal closure (hung up).
CLOSE_REFUSED = 1008
CLOSE_NORMAL = 1000
# A voice webhook's form is a few hundred bytes.
MAX_WEBHOOK_BYTES = 64 * 1024
# A token's expiry: ASCII digits only ("²".isdigit() is True, and int() refuses it).
EXPIRY = re.compile(r"[0-9]{1,12}")
MEDIA_FORMAT = {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}


# ---- the stream token --------------------------------------------------------


def _token_message(call_sid: str, caller: str, callee: str, expires: int) -> bytes:
    return "\n".join(("twilio-stream", call_sid, caller, callee, str(expires))).encode()


def stream_token(
    secret: str, call_sid: str, caller: str, callee: str, now: float | None = None
) -> str:
    """`<expiry>.<hmac>`: vouches that our webhook handed this call's stream out."""
    expires = int(time.time() if now is None else now) + TOKEN_TTL_S
    return f"{expires}.{sign(secret, _token_message(call_sid, caller, callee, expires))}"


def token_expiry(token: str) -> int:
    """The expiry of a token token_valid() took."""
    return int(token.partition(".")[0])


class StreamClaims:
    """A token opens one stream, and a CallSid has one live stream at a time: a
    token seen on the way to Twilio (or a second stream for a call in progress)
    must not open another call on the operator's account. Per replica: run
    Twilio's streams on one replica, or behind a proxy that keeps a CallSid on
    one, for this to hold across replicas."""

    def __init__(self) -> None:
        self._used: dict[str, int] = {}  # token -> its expiry (unix seconds)
        self._live: set[str] = set()  # CallSids with a stream open

    def claim(self, token: str, call_sid: str) -> str:
        """ "" = the stream may go on (the token is used up, the CallSid live until
        end()); else why not."""
        now = time.time()
        self._used = {used: expiry for used, expiry in self._used.items() if expiry >= now}
        if token in self._used:
            return "its token was used already"
        if call_sid in self._live:
            return "the call has a live stream already"
        self._used[token] = token_expiry(token)
        self._live.add(call_sid)
        return ""

    def end(self, call_sid: str) -> None:
        self._live.discard(call_sid)


def member(message: Mapping[str, Any], name: str) -> dict[str, Any]:
    """message[name], a JSON object ({} when absent); ValueError for anything else."""
    value = message.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{name!r} is not an object")
    return value


def text(message: Mapping[str, Any], name: str) -> str:
    """message[name], a string ("" when absent); ValueError for anything else."""
    value = message.get(name, "")
    if not isinstance(value, str):
        raise ValueError(f"{name!r} is not a string")
    return value


def token_valid(
    secret: str, token: str, call_sid: str, caller: str, callee: str, now: float | None = None
) -> bool:
    expires_text, _, signature = token.partition(".")
    if not secret or not EXPIRY.fullmatch(expires_text) or not signature:
        return False
    expires = int(expires_text)
    if expires < (time.time() if now is None else now):
        return False
    expected = sign(secret, _token_message(call_sid, caller, callee, expires))
    return same_signature(signature, expected)


# ---- the webhook -------------------------------------------------------------


def webhook_url(request: Request, settings: TelephonySettings) -> str:
    """The URL Twilio signed: the one configured on the number, which is public_url
    + path behind a proxy; else the URL the request names."""
    if not settings.public_url:
        return str(request.url)
    url = settings.public_url.rstrip("/") + request.url.path
    return f"{url}?{request.url.query}" if request.url.query else url


def stream_url(request: Request, settings: TelephonySettings) -> str:
    """Where Twilio opens the media WebSocket: public_url's host and path prefix
    (wss for https; a proxy that serves us under /prefix strips it again), else
    the host the webhook request came to."""
    prefix = ""
    if settings.public_url:
        parts = urlsplit(settings.public_url)
        scheme, netloc, prefix = parts.scheme, parts.netloc, parts.path.rstrip("/")
    else:
        scheme, netloc = request.url.scheme, request.url.netloc
    ws_scheme = "wss" if scheme == "https" else "ws"
    return f"{ws_scheme}://{netloc}{prefix}{STREAM_PATH}"


def twiml(url: str, parameters: Mapping[str, str], action: str | None = None) -> str:
    """<Connect><Stream>; with `action`, Twilio asks it what follows the stream."""
    response = VoiceResponse()
    connect = Connect() if action is None else Connect(action=action)
    stream = connect.stream(url=url)
    for name, value in parameters.items():
        stream.parameter(name=name, value=value)
    response.append(connect)
    return str(response)


def reject_twiml(reason: str) -> str:
    response = VoiceResponse()
    response.reject(reason=reason)
    return str(response)


async def read_limited(request: Request, limit: int) -> bytes | None:
    """The request's body, or None once it grows past `limit` bytes (not read further)."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


class TwilioWebhook:
    def __init__(self, telephony: Telephony, transfers: Transfers) -> None:
        self.telephony = telephony
        self.settings = telephony.settings
        self.transfers = transfers
        # <Connect action> only where the agent may transfer: else the call ends
        # with the stream, as it always did.
        self._action = AFTER_ACTION if "transfer" in self.settings.call_control_actions else None

    async def _signed_form(self, request: Request) -> ImmutableMultiDict[str, str] | Response:
        """The form of a request Twilio signed; else the error response to send."""
        body = await read_limited(request, MAX_WEBHOOK_BYTES)
        if body is None:
            self.telephony.refused(PROVIDER, "protocol")
            return PlainTextResponse("request too large", status_code=413)
        # Twilio posts application/x-www-form-urlencoded; a key may repeat, and the
        # signature covers every value (the validator reads them with getlist).
        form = ImmutableMultiDict(
            parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
        )
        if not self._signed(request, form):
            self.telephony.refused(PROVIDER, "signature")
            log.warning(
                "twilio: webhook from %s refused: %s",
                request.client.host if request.client else "?",
                "no twilio_auth_token configured"
                if not self.settings.twilio_auth_token
                else "bad or missing X-Twilio-Signature",
            )
            return PlainTextResponse("forbidden", status_code=403)
        return form

    async def after(self, request: Request) -> Response:
        """<Connect action>: the stream has closed. A call the agent transferred is
        dialled to its target; any other ends."""
        form = await self._signed_form(request)
        if isinstance(form, Response):
            return form
        call_sid = form.get("CallSid", "")
        uri = self.transfers.take(call_sid)
        if uri is None:
            return Response(hangup_twiml(), media_type="application/xml")
        log.info("twilio: call %s: dialling the transfer target %s", call_sid, uri)
        return Response(dial_twiml(uri), media_type="application/xml")

    async def voice(self, request: Request) -> Response:
        form = await self._signed_form(request)
        if isinstance(form, Response):
            return form
        call_sid = form.get("CallSid", "")
        caller, callee = form.get("From", ""), form.get("To", "")
        if not call_sid:
            self.telephony.refused(PROVIDER, "protocol")
            return PlainTextResponse("CallSid missing", status_code=400)
        if reason := self.telephony.refusal(PROVIDER):
            log.info("twilio: call %s rejected: %s", call_sid, reason)
            return Response(reject_twiml("busy"), media_type="application/xml")
        token = stream_token(self.settings.twilio_auth_token, call_sid, caller, callee)
        parameters = {"from": caller, "to": callee, "call_sid": call_sid, "token": token}
        answer = twiml(stream_url(request, self.settings), parameters, self._action)
        return Response(answer, media_type="application/xml")

    def _signed(self, request: Request, params: ImmutableMultiDict[str, str]) -> bool:
        token = self.settings.twilio_auth_token
        signature = request.headers.get("x-twilio-signature", "")
        if not token or not signature:
            return False
        # HMAC-SHA1 under the auth token, unless the request names another algorithm
        # (webhooks signed with a SharedKey: then twilio_auth_token holds its secret).
        algorithm = get_signature_algorithm(request.headers.get(SIGNATURE_SETTINGS_HEADER, ""))
        validator = RequestValidator(token)
        url = webhook_url(request, self.settings)
        return bool(validator.validate(url, params, signature, algorithm=algorithm))


# ---- the media stream ----------------------------------------------------------


class StreamRefused(Exception):
    """The stream's start is not one we bridge; says why (logged) and the metric reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class TwilioStream:
    """One Media Streams WebSocket, and the PhoneLeg of its call."""

    def __init__(
        self,
        telephony: Telephony,
        websocket: WebSocket,
        claims: StreamClaims,
        transfers: Transfers,
    ) -> None:
        self.telephony = telephony
        self.websocket = websocket
        self.claims = claims
        self.transfers = transfers
        self.stream_sid = ""
        self.call: PhoneCall | None = None
        self._send_lock = asyncio.Lock()
        self._speaking = False
        self._marks_sent = 0
        self._pending_marks: dict[str, float] = {}  # mark name -> when it was sent
        self._closed = False

    async def run(self) -> None:
        await self.websocket.accept()
        try:
            start = await asyncio.wait_for(self._await_start(), START_TIMEOUT_S)
            call = self._admit(start)
        except StreamRefused as refused:
            if refused.reason:  # "" = counted already (by Telephony.refusal)
                self.telephony.refused(PROVIDER, refused.reason)
            log.warning("twilio: stream refused: %s", refused)
            await self._close(CLOSE_REFUSED, str(refused))
            return
        except TimeoutError:
            self.telephony.refused(PROVIDER, "protocol")
            log.warning("twilio: no start message within %g s: closing", START_TIMEOUT_S)
            await self._close(CLOSE_REFUSED, "no start message")
            return
        except WebSocketDisconnect:
            return
        self.call = call
        reader = asyncio.ensure_future(self._read(call))
        try:
            await self.telephony.run(call)
        finally:
            self.telephony.release()
            self.claims.end(call.info.provider_call_id)
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            await self._close(CLOSE_NORMAL, "call ended")

    async def _receive(self) -> dict[str, Any] | None:
        """The next message as a dict; None when the socket closed."""
        message = await self.websocket.receive()
        if message["type"] == "websocket.disconnect":
            return None
        body = message.get("text")
        if body is None:
            raise ValueError("a binary message (Media Streams sends JSON text)")
        try:
            data = json.loads(body)
        except RecursionError:  # nested deeper than the parser goes
            raise ValueError("JSON nested too deep") from None
        if not isinstance(data, dict) or not isinstance(data.get("event"), str):
            raise ValueError(f"not a Media Streams message: {body[:80]!r}")
        return data

    async def _await_start(self) -> dict[str, Any]:
        """Messages up to `start` (`connected` comes first); the start message."""
        while True:
            try:
                message = await self._receive()
            except ValueError as exc:
                raise StreamRefused("protocol", str(exc)) from None
            if message is None:
                raise WebSocketDisconnect()
            if message["event"] == "start":
                return message
            if message["event"] != "connected":
                raise StreamRefused("protocol", f"{message['event']!r} before start")

    def _admit(self, message: dict[str, Any]) -> PhoneCall:
        """The call of a `start` message, its slot taken (admit()) and its token and
        CallSid claimed; StreamRefused when it is not one to bridge."""
        try:
            start = member(message, "start")
            self.stream_sid = text(message, "streamSid") or text(start, "streamSid")
            call_sid = text(start, "callSid")
            params = member(start, "customParameters")
            caller, callee, token = text(params, "from"), text(params, "to"), text(params, "token")
            media_format = member(start, "mediaFormat")
        except ValueError as exc:
            raise StreamRefused("protocol", f"start message: {exc}") from None
        if not start:
            raise StreamRefused("protocol", "a start message without start")
        secret = self.telephony.settings.twilio_auth_token
        if not token_valid(secret, token, call_sid, caller, callee):
            raise StreamRefused(
                "signature", f"stream {self.stream_sid} (call {call_sid}): bad or expired token"
            )
        if {key: media_format.get(key) for key in MEDIA_FORMAT} != MEDIA_FORMAT:
            raise StreamRefused(
                "codec", f"call {call_sid}: mediaFormat {media_format}, expected {MEDIA_FORMAT}"
            )
        if why := self.claims.claim(token, call_sid):
            raise StreamRefused("replay", f"stream {self.stream_sid} (call {call_sid}): {why}")
        if reason := self.telephony.admit(PROVIDER):
            self.claims.end(call_sid)
            raise StreamRefused("", f"call {call_sid}: {reason}")
        info = CallInfo(PROVIDER, caller=caller, callee=callee, provider_call_id=call_sid)
        log.info("twilio: call %s, stream %s", call_sid, self.stream_sid)
        log.debug("twilio: call %s is from %s to %s", call_sid, caller, callee)
        return self.telephony.new_call(info, PCMU, self)

    async def _read(self, call: PhoneCall) -> None:
        """Twilio's messages into the call until `stop`, the socket closes, or a
        message is not what Media Streams sends (the stream is closed)."""
        try:
            while (message := await self._receive()) is not None:
                event = message["event"]
                if event == "media":
                    self._on_media(call, message)
                elif event == "dtmf":
                    call.caller_dtmf(text(member(message, "dtmf"), "digit"))
                elif event == "mark":
                    self._on_mark(message)
                elif event == "stop":
                    log.info("twilio: stream %s stopped by Twilio", self.stream_sid)
                    break
        except (WebSocketDisconnect, RuntimeError):
            pass  # the socket went away: the caller is gone
        except ValueError as exc:  # binascii.Error, a bad payload, is one too
            self.telephony.refused(PROVIDER, "protocol")
            log.warning("twilio: stream %s: malformed message: %s: closing", self.stream_sid, exc)
            await self._close(CLOSE_REFUSED, "malformed message")
        call.caller_hung_up()

    def _on_media(self, call: PhoneCall, message: dict[str, Any]) -> None:
        media = member(message, "media")
        if (text(media, "track") or "inbound") != "inbound":
            return
        call.caller_audio(base64.b64decode(text(media, "payload"), validate=True))

    def _on_mark(self, message: dict[str, Any]) -> None:
        name = text(member(message, "mark"), "name")
        sent = self._pending_marks.pop(name, None)
        if sent is not None:
            metrics.TWILIO_PLAYOUT_DELAY.observe(time.monotonic() - sent)

    # ---- PhoneLeg --------------------------------------------------------------

    async def send_audio(self, packet: bytes, speaking: bool) -> None:
        if self._speaking and not speaking:
            await self._send_mark()  # the stretch of speech before it has been sent
        self._speaking = speaking
        payload = base64.b64encode(packet).decode()
        await self._send(
            {"event": "media", "streamSid": self.stream_sid, "media": {"payload": payload}}
        )

    async def clear(self) -> None:
        # Twilio echoes the marks it had queued at once: not a playout delay.
        self._pending_marks.clear()
        self._speaking = False
        await self._send({"event": "clear", "streamSid": self.stream_sid})

    async def hang_up(self, reason: str) -> None:
        log.info("twilio: stream %s: hanging up: %s", self.stream_sid, reason)
        await self._close(CLOSE_NORMAL, "call ended")

    # ---- call control (services/telephony/call_control.py) ------------------------

    async def transfer(self, target_uri: str) -> str:
        """Close the stream with the call marked for `target_uri`: Twilio then asks
        <Connect>'s action what comes next, and is told to <Dial> it."""
        if self.call is None:
            raise CallControlError("the call is not in progress")
        self.transfers.add(self.call.info.provider_call_id, target_uri)
        self.call.hang_up(f"transferred to {target_uri}")
        return f"handed to Twilio to dial {target_uri} (the outcome is Twilio's)"

    async def send_dtmf(self, digits: str) -> None:
        raise CallControlError("Twilio calls cannot send keys: Media Streams has no such message")

    async def _send_mark(self) -> None:
        self._marks_sent += 1
        name = f"agent-{self._marks_sent}"
        self._pending_marks[name] = time.monotonic()
        await self._send({"event": "mark", "streamSid": self.stream_sid, "mark": {"name": name}})

    async def _send(self, message: dict[str, Any]) -> None:
        """Send one message; a socket that has gone away drops it (the reader sees the
        close and hangs the call up)."""
        if self._closed:
            return
        async with self._send_lock:
            try:
                await self.websocket.send_text(json.dumps(message, separators=(",", ":")))
            except (WebSocketDisconnect, RuntimeError, OSError):
                self._closed = True

    async def _close(self, code: int, reason: str) -> None:
        if self._closed:
            return
        self._closed = True
        async with self._send_lock:
            if self.websocket.application_state != WebSocketState.DISCONNECTED:
                with contextlib.suppress(RuntimeError, OSError):
                    await self.websocket.close(code=code, reason=reason)


def twilio_routes(telephony: Telephony) -> list[BaseRoute]:
    transfers = Transfers()
    webhook = TwilioWebhook(telephony, transfers)
    claims = StreamClaims()

    async def stream(websocket: WebSocket) -> None:
        await TwilioStream(telephony, websocket, claims, transfers).run()

    return [
        Route(VOICE_PATH, webhook.voice, methods=["POST"]),
        Route(AFTER_PATH, webhook.after, methods=["POST"]),
        WebSocketRoute(STREAM_PATH, stream),
    ]
