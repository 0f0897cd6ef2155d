"""Fuzzing with Hypothesis (bounded: 200 examples a property, 25 through a real
gateway) of everything that reads caller bytes: the decoders of every input
format (PCM16 at several rates, G.711 mu-law and A-law, Opus), the audio
helpers under them, the input limits, and config validation, alone and through
a real gateway on loopback. What may come out is only what is documented:
samples, CodecError/ValueError naming the problem, SessionError with
INVALID_ARGUMENT; through the gateway a status of the documented list."""

from __future__ import annotations

import asyncio
import math
import urllib.parse

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kame_client.codecs import AudioFormat, CodecError, Decoder
from kame_common.audio import (
    SAMPLE_RATE,
    Framer,
    alaw_decode,
    check_frame,
    mulaw_decode,
    pcm16_to_float,
)
from kamepb import (
    frontend_pb2_grpc,
    gateway_pb2,
    oracle_pb2_grpc,
    stt_pb2_grpc,
)
from kamepb.common_pb2 import LlmBackend
from services.gateway.config import GatewaySettings
from services.gateway.pacing import InputGuard, InputLimits, audio_seconds
from services.gateway.plan import SessionError, plan_session
from services.gateway.server import serve
from tests.gateway.fakes import FakeFrontend, FakeOracle, FakeStt, serve_fake, sync_converse
from tests.support import wait_until

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
THROUGH_GATEWAY = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
FORMATS = [
    *(AudioFormat("pcm16", rate) for rate in (8_000, 16_000, 22_050, 24_000, 48_000, 192_000)),
    AudioFormat("mulaw", 8_000),
    AudioFormat("alaw", 8_000),
    AudioFormat("opus", 48_000),
]
Codec = gateway_pb2.AudioFormat.Codec
# What a caller may get from the gateway: the documented statuses (services/gateway/README.md).
DOCUMENTED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
}


def opus_like_packets() -> st.SearchStrategy[bytes]:
    """Any bytes, and packets with a valid TOC byte (each of the 32 configurations,
    each frame-count code) before random payload, which reach deeper into libopus."""
    toc = st.builds(
        lambda config, code: (config << 3) | code, st.integers(0, 31), st.integers(0, 3)
    )
    framed = st.builds(lambda t, rest: bytes([t]) + rest, toc, st.binary(max_size=1500))
    return st.one_of(st.binary(max_size=2000), framed)


@FUZZ
@given(
    fmt=st.sampled_from(FORMATS),
    chunks=st.lists(st.one_of(st.binary(max_size=4000), opus_like_packets()), max_size=6),
)
def test_decoders_return_samples_or_a_codec_error(fmt, chunks):
    decoder = Decoder(fmt)
    for chunk in chunks:
        try:
            samples = decoder.decode(chunk)
        except CodecError as exc:
            assert str(exc)  # says what was expected; the session ends INVALID_ARGUMENT
            return
        assert samples.dtype == np.float32 and samples.ndim == 1
        assert np.all(np.isfinite(samples))
        assert np.all(np.abs(samples) <= 8.0)  # resampling overshoots a little, no more
    tail = decoder.flush()
    assert tail.dtype == np.float32 and np.all(np.isfinite(tail))


@FUZZ
@given(data=st.binary(max_size=8000))
def test_audio_helpers_take_any_bytes(data):
    assert len(mulaw_decode(data)) == len(alaw_decode(data)) == 2 * len(data)
    if len(data) % 2:
        with pytest.raises(ValueError, match="even byte count"):
            pcm16_to_float(data)
        return
    samples = pcm16_to_float(data)
    assert np.all((samples >= -1.0) & (samples < 1.0))
    framer = Framer()
    frames = framer.push(samples)
    assert all(len(f) == framer.frame_samples for f in frames)
    assert sum(map(len, frames)) + framer.pending_samples == len(samples)


@FUZZ
@given(pcm=st.binary(max_size=5000), rate=st.integers(0, 200_000))
def test_check_frame_raises_only_value_error(pcm, rate):
    try:
        check_frame(pcm, rate)
    except ValueError as exc:
        assert str(exc)
    else:
        assert rate == SAMPLE_RATE and len(pcm) == 3840


@FUZZ
@given(fmt=st.sampled_from(FORMATS), chunks=st.lists(opus_like_packets(), max_size=10))
def test_input_limits_take_any_bytes(fmt, chunks):
    guard = InputGuard(fmt, InputLimits(idle_timeout_s=10, input_burst_s=2, max_chunk_s=1))
    for chunk in chunks:
        assert 0 <= audio_seconds(chunk, fmt) <= max(1.0, len(chunk))
        try:
            guard.check(chunk)
        except SessionError as exc:
            assert exc.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            return


def either(valid: list[int], wild: st.SearchStrategy[int], wild_values: bool) -> st.SearchStrategy:
    return wild if wild_values else st.sampled_from(valid)


VALID_FORMATS = [
    *((Codec.PCM16, rate) for rate in (0, 8_000, 16_000, 44_100, 192_000)),
    (Codec.CODEC_UNSPECIFIED, 0),
    (Codec.MULAW, 8_000),
    (Codec.ALAW, 0),
    (Codec.OPUS, 48_000),
]


def audio_formats(wild: bool) -> st.SearchStrategy[gateway_pb2.AudioFormat]:
    """Any codec and rate, or a valid pair."""
    if not wild:
        return st.sampled_from(VALID_FORMATS).map(
            lambda pair: gateway_pb2.AudioFormat(codec=pair[0], sample_rate_hz=pair[1])
        )
    return st.builds(
        gateway_pb2.AudioFormat,
        codec=st.integers(-(2**31), 2**31 - 1),
        sample_rate_hz=st.integers(-(2**31), 2**31 - 1),
    )


def converse_configs() -> st.SearchStrategy[gateway_pb2.ConverseConfig]:
    """Configs whose mode and formats are anything (most are refused for them) or
    taken from the valid ones (so the other fields get looked at)."""
    return st.booleans().flatmap(_converse_configs)


def _converse_configs(wild: bool) -> st.SearchStrategy[gateway_pb2.ConverseConfig]:
    text = st.text(max_size=80)
    llm = st.builds(
        gateway_pb2.LlmOverride,
        backend=either(list(LlmBackend.values()), st.integers(-(2**31), 2**31 - 1), wild),
        model=text,
        base_url=text,
        api_key=text,
    )
    hold = st.builds(
        gateway_pb2.HoldConfig,
        phrases=st.lists(text, max_size=12),
        silent=st.booleans(),
        max_s=st.floats(allow_nan=True, allow_infinity=True),
    )
    modes = list(gateway_pb2.ConverseConfig.Mode.values())
    return st.builds(
        gateway_pb2.ConverseConfig,
        mode=either(modes, st.integers(-(2**31), 2**31 - 1), wild),
        input_format=audio_formats(wild),
        output_format=audio_formats(wild),
        voice=text,
        language=text,
        llm=st.one_of(st.none(), llm),
        include_oracle_updates=st.booleans(),
        hold=st.one_of(st.none(), hold),
    )


@FUZZ
@given(config=converse_configs())
def test_plan_session_plans_or_names_the_bad_field(config):
    try:
        plan = plan_session(config, GatewaySettings())
    except SessionError as exc:
        assert exc.code == grpc.StatusCode.INVALID_ARGUMENT
        field = exc.message.split(":", 1)[0]
        assert field in {
            "mode",
            "input_format.codec",
            "input_format.sample_rate_hz",
            "output_format.codec",
            "output_format.sample_rate_hz",
            "llm.backend",
            "hold.max_s",
            "hold.phrases",
        }, exc.message
        return
    assert math.isfinite(plan.hold_max_s) and plan.hold_max_s >= 0
    assert plan.input_format.sample_rate > 0 and plan.output_format.sample_rate > 0


@pytest.fixture(scope="module")
def loopback_gateway(redis_url):
    """A real gateway against the fake upstreams, on an event loop of its own that
    each example runs (Hypothesis drives plain functions, not coroutines)."""
    loop = asyncio.new_event_loop()
    parts = urllib.parse.urlsplit(redis_url)

    async def start() -> tuple[list[grpc.aio.Server], object]:
        servers, addresses = [], {}
        for name, add, servicer in (
            ("frontend", frontend_pb2_grpc.add_FrontendServicer_to_server, FakeFrontend()),
            ("stt", stt_pb2_grpc.add_SttServicer_to_server, FakeStt()),
            ("oracle", oracle_pb2_grpc.add_OracleServicer_to_server, FakeOracle()),
        ):
            server, addresses[name] = await serve_fake(add, servicer)
            servers.append(server)
        settings = GatewaySettings(
            host="127.0.0.1",
            port=0,
            metrics_port=0,
            redis_url=urllib.parse.urlunsplit(parts._replace(path="/10")),
            registry_secret="registry-secret-of-the-fake-upstreams",
            frontend_address=addresses["frontend"],
            stt_address=addresses["stt"],
            oracle_address=addresses["oracle"],
            connect_timeout_s=2.0,
            drain_timeout_s=0.5,
        )
        return servers, await serve(settings)

    servers, runtime = loop.run_until_complete(start())
    yield loop, runtime
    loop.run_until_complete(runtime.stop())
    for server in servers:
        loop.run_until_complete(server.stop(grace=0))
    loop.close()


@THROUGH_GATEWAY
@given(
    config=converse_configs(),
    chunks=st.lists(st.one_of(st.binary(max_size=3000), opus_like_packets()), max_size=5),
)
def test_any_config_and_audio_through_a_real_gateway_get_a_documented_status(
    loopback_gateway, config, chunks
):
    loop, runtime = loopback_gateway
    requests = [gateway_pb2.ConverseRequest(config=config)]
    requests += [gateway_pb2.ConverseRequest(audio=chunk) for chunk in chunks]
    # The gateway's loop runs while the call is made from a thread.
    code, details, _ = loop.run_until_complete(
        asyncio.to_thread(sync_converse, runtime.address, requests)
    )
    assert code in DOCUMENTED, (code, details)
    assert code == grpc.StatusCode.OK or details
    loop.run_until_complete(
        wait_until(lambda: runtime.active_sessions == 0, "the session to close", 5)
    )
