"""Asterisk AudioSocket server (being written)."""

from __future__ import annotations

from services.telephony.service import Telephony


class AudioSocketServer:
    def __init__(self, telephony: Telephony) -> None:
        self.telephony = telephony
        self.port = 0

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        pass
