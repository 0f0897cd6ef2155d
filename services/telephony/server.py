"""The telephony service: SIP (UDP), Twilio Media Streams (HTTP + WebSocket) and
Asterisk AudioSocket (TCP) on one replica, each phone call one Converse call.

HTTP also answers GET /healthz (503 while draining) for probes; /metrics is on
its own port like every service's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from kame_common import tracing
from kame_common.http_server import HttpServer
from kame_common.server import service_main, until_signal
from services.telephony.audiosocket import AudioSocketServer
from services.telephony.config import TelephonySettings
from services.telephony.service import Telephony
from services.telephony.sip import SipServer
from services.telephony.twilio import twilio_routes

log = logging.getLogger(__name__)


class TelephonyServer:
    """The three protocol servers around one `Telephony`."""

    def __init__(self, settings: TelephonySettings) -> None:
        self.settings = settings
        self.telephony = Telephony(settings)
        app = Starlette(routes=[Route("/healthz", self.healthz), *twilio_routes(self.telephony)])
        self.http = HttpServer(app, settings, "telephony")
        self.sip = SipServer(self.telephony) if settings.sip_port >= 0 else None
        self.audiosocket = (
            AudioSocketServer(self.telephony) if settings.audiosocket_port >= 0 else None
        )

    @property
    def port(self) -> int:
        return self.http.port

    @property
    def url(self) -> str:
        return self.http.url

    async def healthz(self, _request: Request) -> Response:
        if self.telephony.draining:
            return PlainTextResponse("draining", status_code=503)
        return PlainTextResponse("ok")

    async def start(self) -> None:
        await self.http.start()
        if self.sip is not None:
            await self.sip.start()
        if self.audiosocket is not None:
            await self.audiosocket.start()
        log.info("telephony: %s", self.describe())

    def describe(self) -> str:
        """Where phones reach this replica, in one line."""
        host = self.settings.host
        parts = [f"Twilio {self.url}twilio/voice"]
        if self.sip is not None:
            parts.insert(0, f"SIP udp {host}:{self.sip.port}")
        if self.audiosocket is not None:
            parts.append(f"AudioSocket tcp {host}:{self.audiosocket.port}")
        return ", ".join(parts)

    async def stop(self, grace_s: float = 0.0) -> None:
        """No new calls; open ones get up to `grace_s`, then are hung up."""
        self.telephony.draining = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.telephony.idle.wait(), grace_s)
        self.telephony.hang_up_all()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.telephony.idle.wait(), 5.0)
        if self.sip is not None:
            await self.sip.stop()
        if self.audiosocket is not None:
            await self.audiosocket.stop()
        await self.http.shut_down()
        await self.telephony.aclose()

    async def serve_until_stopped(self) -> None:
        await until_signal()
        await self.stop(self.settings.grace_s)


async def serve(settings: TelephonySettings) -> TelephonyServer:
    """Start the telephony service; stop it with `await server.stop()`."""
    tracing.setup_tracing("telephony", settings.otlp_endpoint, settings.otlp_ca_file)
    settings.check_gateway_ca()
    server = TelephonyServer(settings)
    await server.start()
    return server


def main(argv: Sequence[str] | None = None) -> int:
    return service_main(TelephonySettings, serve, argv)
