"""Twilio Media Streams (being written)."""

from __future__ import annotations

from starlette.routing import BaseRoute

from services.telephony.service import Telephony


def twilio_routes(telephony: Telephony) -> list[BaseRoute]:
    return []
