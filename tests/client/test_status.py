"""How a call ended, as each edge says it (kame_client/status.py): the
retry-after hint read once, words a person can read that name no internal
address, and the WebSocket close code, Realtime error type and SIP response
of each status."""

from __future__ import annotations

import grpc
import pytest

from kame_client.status import (
    MAX_RETRY_AFTER_S,
    CallEnd,
    CloseCode,
    retry_after_s,
    sip_refusal,
)

Code = grpc.StatusCode


class Refusal(grpc.aio.AioRpcError):
    def __init__(
        self, *trailing: tuple[str, str], code: grpc.StatusCode = Code.RESOURCE_EXHAUSTED
    ) -> None:
        super().__init__(
            code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailing), details="stt is at capacity"
        )


@pytest.mark.parametrize(
    ("trailing", "hint"),
    [
        ((("retry-after-s", "2.5"),), 2.5),
        ((("other", "1"), ("retry-after-s", "0")), 0.0),
        ((), None),
        ((("retry-after-s", "soon"),), None),
        ((("retry-after-s", "-1"),), None),
        ((("retry-after-s", "inf"),), None),
        ((("retry-after-s", "86400"),), MAX_RETRY_AFTER_S),
    ],
)
def test_the_retry_hint_is_read_only_when_it_is_a_time(trailing, hint):
    assert retry_after_s(Refusal(*trailing)) == hint


def test_the_retry_hint_counts_only_for_a_refusal_for_now():
    assert retry_after_s(Refusal(("retry-after-s", "2"), code=Code.UNAVAILABLE)) == 2.0
    assert retry_after_s(Refusal(("retry-after-s", "2"), code=Code.INVALID_ARGUMENT)) is None


def test_a_call_end_reads_the_status_and_hint_once():
    end = CallEnd.of(Refusal(("retry-after-s", "2.5")))
    assert (end.name, end.details, end.retry_after_s, end.reached) == (
        "RESOURCE_EXHAUSTED",
        "stt is at capacity",
        2.5,
        True,
    )
    assert end.summary() == "RESOURCE_EXHAUSTED: stt is at capacity"


def test_errors_say_what_happened_in_words():
    refused = CallEnd(Code.UNAUTHENTICATED, "invalid bearer token").message()
    assert refused.startswith("auth refused") and "invalid bearer token" in refused
    broken = CallEnd(Code.UNAVAILABLE, "the frontend failed").message()
    assert broken.startswith("the call broke off"), broken
    starting = CallEnd(Code.UNAVAILABLE, "no frontend registered yet", retry_after_s=5).message()
    assert starting.startswith("the agent is not ready yet: try again in 5 s"), starting
    busy = CallEnd(Code.RESOURCE_EXHAUSTED, "stt is at capacity", retry_after_s=2.5).message()
    assert busy.startswith("the agent is busy: try again in 2.5 s"), busy
    assert CallEnd(Code.DATA_LOSS, "what").message() == "DATA_LOSS: what"


def test_a_gateway_never_reached_is_said_in_words_only():
    grpc_words = "failed to connect to all addresses; last error: ipv4:10.0.0.5:50051"
    unreachable = CallEnd(Code.UNAVAILABLE, grpc_words, reached=False)
    assert unreachable.message().startswith("gateway down"), unreachable.message()
    assert "10.0.0.5" not in unreachable.message()
    # A hint only the gateway sends: it was reached, whatever the channel said.
    assert not CallEnd(Code.UNAVAILABLE, "starting", retry_after_s=1, reached=True).unreachable


def test_errors_name_no_internal_address():
    grpc_words = (
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:10.0.0.5:50051: "
        "Failed to connect to remote host: Connection refused (stt-0.kame-stt:50053, "
        "[fd00::5]:50051, http://oracle.internal/v1)"
    )
    message = CallEnd(Code.UNAVAILABLE, grpc_words).message()
    for address in ("10.0.0.5", "kame-stt", "fd00::5", "oracle.internal"):
        assert address not in message, message
    assert "Connection refused" in message


@pytest.mark.parametrize(
    ("code", "close", "error_type"),
    [
        (Code.OK, CloseCode.NORMAL_CLOSURE, "server_error"),
        (Code.OUT_OF_RANGE, CloseCode.NORMAL_CLOSURE, "invalid_request_error"),
        (Code.UNAUTHENTICATED, CloseCode.POLICY_VIOLATION, "invalid_request_error"),
        (Code.INVALID_ARGUMENT, CloseCode.POLICY_VIOLATION, "invalid_request_error"),
        (Code.RESOURCE_EXHAUSTED, CloseCode.TRY_AGAIN_LATER, "server_error"),
        (Code.UNAVAILABLE, CloseCode.TRY_AGAIN_LATER, "server_error"),
        (Code.INTERNAL, CloseCode.INTERNAL_ERROR, "server_error"),
    ],
)
def test_each_status_has_its_close_code_and_realtime_error_type(code, close, error_type):
    end = CallEnd(code)
    assert (end.close_code, end.error_type) == (close, error_type)


def test_a_ringing_phone_hears_503_with_the_hint_in_whole_seconds():
    assert sip_refusal(CallEnd(Code.RESOURCE_EXHAUSTED, retry_after_s=2.5)) == (
        503,
        "Service Unavailable",
        {"Retry-After": "3"},
    )
    assert sip_refusal(CallEnd(Code.UNAVAILABLE, retry_after_s=0))[2] == {"Retry-After": "1"}
    assert sip_refusal(CallEnd(Code.UNAUTHENTICATED)) == (503, "Service Unavailable", {})
    assert sip_refusal(None) == (503, "Service Unavailable", {}), "no session at all"
