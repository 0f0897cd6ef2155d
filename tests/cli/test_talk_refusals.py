"""`kame talk` reports a gateway's refusal as the gateway sent it. Its audio waits
until the session started: a write under way when the gateway ends the call
turns grpc.aio's status into INTERNAL "Internal error from Core"
(grpc/grpc#36066).

The refusal here comes after the gateway read the config (no frontend slot).
A refusal by the auth interceptor, before the config is read, can still race
the config's own write; that case is not covered (see the web bridge test for
a page that streams audio with a wrong token)."""

from __future__ import annotations

import grpc
import numpy as np

from kame_cli.talk import TalkOptions, talk
from kame_common.audio import SAMPLE_RATE


async def test_a_refused_call_is_reported_with_the_gateways_status(fakes):
    fakes.frontend.refuse = grpc.StatusCode.RESOURCE_EXHAUSTED
    gateway = await fakes.gateway()
    caller = np.zeros(2 * SAMPLE_RATE, np.float32)
    options = TalkOptions(gateway=gateway.address, max_wait_s=2.0)
    for _ in range(5):
        result = await talk(caller, options)
        assert (result.status, result.started) == ("RESOURCE_EXHAUSTED", {}), result.status_details
