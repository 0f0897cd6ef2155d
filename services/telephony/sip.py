"""SIP user agent (being written): answers INVITEs, RTP both ways."""

from __future__ import annotations

from services.telephony.service import Telephony


class SipServer:
    def __init__(self, telephony: Telephony) -> None:
        self.telephony = telephony
        self.port = 0

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        pass
