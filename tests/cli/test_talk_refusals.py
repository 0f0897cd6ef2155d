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

from kame_cli.talk import TalkOptions, broke_off, talk
from kame_common.audio import SAMPLE_RATE


async def test_a_refused_call_is_reported_with_the_gateways_status(fakes):
    fakes.frontend.refuse = grpc.StatusCode.RESOURCE_EXHAUSTED
    gateway = await fakes.gateway()
    caller = np.zeros(2 * SAMPLE_RATE, np.float32)
    options = TalkOptions(gateway=gateway.address, max_wait_s=2.0)
    for _ in range(5):
        result = await talk(caller, options)
        assert (result.status, result.started) == ("RESOURCE_EXHAUSTED", None), (
            result.status_details
        )


def test_a_call_broken_off_under_a_write_is_continued_and_a_refusal_is_not():
    """The statuses `kame talk` continues with its resume token: the gateway went away
    (UNAVAILABLE, or grpc.aio's INTERNAL for a write under way when the connection broke,
    as seen when the gateway was killed); not a refusal or an error of the gateway's own."""
    assert broke_off("UNAVAILABLE", "Socket closed")
    assert broke_off("INTERNAL", "Internal error from Core")
    assert not broke_off("INTERNAL", "the frontend failed: engine error")
    assert not broke_off("RESOURCE_EXHAUSTED", "no capacity")
    assert not broke_off("OK", "")
