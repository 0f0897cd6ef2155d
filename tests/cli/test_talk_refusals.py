"""`kame talk` reports a gateway's refusal as the gateway sent it. Its audio waits
until the session started: a write under way when the gateway ends the call
turns grpc.aio's status into INTERNAL "Internal error from Core"
(grpc/grpc#36066)."""

from __future__ import annotations

import numpy as np

from kame_cli.talk import TalkOptions, talk
from kame_common.audio import SAMPLE_RATE


async def test_a_refused_call_is_reported_with_the_gateways_status(fakes):
    gateway = await fakes.gateway(auth_tokens="the-right-token-0123456789")
    caller = np.zeros(2 * SAMPLE_RATE, np.float32)
    options = TalkOptions(gateway=gateway.address, auth_token="a-wrong-token-0123456789")
    for _ in range(5):
        result = await talk(caller, options)
        assert (result.status, result.started) == ("UNAUTHENTICATED", {}), result.status_details
