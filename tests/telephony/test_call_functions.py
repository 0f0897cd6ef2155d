"""Call control as client functions (#33): a phone call declares the call
control the operator enabled in its Converse config, runs each function_call
the gateway sends as a task of its own, and answers with a function_result.

The gateway's side is played by `ScriptedGateway`, a Converse server written
here, so that each call and its timing are the test's to choose (the whole way
through the real gateway, oracle and an LLM: tests/e2e/test_call_control_stack.py):
the config in, SessionStarted out, FunctionCall out, FunctionResult in. The
phone is real where it matters: baresip hears our keys, gets our REFER, and is
hung up with our BYE."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections.abc import AsyncIterator

import grpc

from kamepb import common_pb2, gateway_pb2, gateway_pb2_grpc
from services.oracle.config import OracleSettings
from services.telephony.call import CallInfo, CallSettings, Ended, PhoneCall
from services.telephony.call_control import CallControlPolicy
from services.telephony.call_functions import ANSWER_WITHIN_S, CallFunctions
from services.telephony.config import TelephonySettings
from services.telephony.playout import PCMU
from services.telephony.service import Telephony
from services.telephony.sip import SipServer
from tests.gateway.fakes import serve_fake
from tests.support import wait_until
from tests.telephony.sip_support import sipp, transferee
from tests.telephony.test_call_control import ALL_ON, keys_heard, the_call
from tests.telephony.test_sip import baresip_call, one_session

SALES = "sip:sales@127.0.0.1:5999"
SETTINGS = CallSettings(mode=1, auth_token="", prebuffer_ms=40, max_queued_ms=1000)
# The oracle's default tool_timeout_s: a function answered later is an error to the model.
ORACLE_TOOL_TIMEOUT_S = OracleSettings().tool_timeout_s

Response = gateway_pb2.ConverseResponse


class ScriptedGateway(gateway_pb2_grpc.GatewayServicer):
    """One Converse call at a time: records the config, starts the session, answers
    each caller packet with as much agent silence (a gateway's agent audio runs
    with the caller's: the phone's RTP, keys included, goes out on it), sends the
    function calls `call()` asks for and hands back their results; ends the call
    when the client half-closes (as the gateway finishes a session)."""

    def __init__(self) -> None:
        self.configs: list[gateway_pb2.ConverseConfig] = []
        self.results: dict[str, asyncio.Future[common_pb2.FunctionResult]] = {}
        self.received: list[common_pb2.FunctionResult] = []  # every result, in order
        self.half_closed = asyncio.Event()
        self._outbox: asyncio.Queue[Response | None] = asyncio.Queue()
        self._call_ids = itertools.count(1)

    async def Converse(self, request_iterator, context):  # noqa: N802 (gRPC method name)
        reader = asyncio.ensure_future(self._read(request_iterator))
        try:
            while (response := await self._outbox.get()) is not None:
                yield response
        finally:
            reader.cancel()

    async def _read(self, requests: AsyncIterator[gateway_pb2.ConverseRequest]) -> None:
        async for request in requests:
            if request.HasField("config"):
                self.configs.append(request.config)
                started = gateway_pb2.SessionStarted(session_id=f"scripted-{len(self.configs)}")
                self._outbox.put_nowait(Response(started=started))
            elif request.HasField("audio"):
                silence = b"\xff" * len(request.audio)  # mu-law
                self._outbox.put_nowait(Response(audio=gateway_pb2.AgentAudioChunk(data=silence)))
            elif request.HasField("function_result"):
                result = request.function_result
                self.received.append(result)
                future = self.results.get(result.call_id)
                if future is not None and not future.done():
                    future.set_result(result)
        self.half_closed.set()
        self._outbox.put_nowait(None)

    def send_call(self, name: str, arguments: object) -> str:
        """A FunctionCall to the client (`arguments` as JSON, or a str as it is)."""
        call_id = f"call-{next(self._call_ids)}"
        self.results[call_id] = asyncio.get_running_loop().create_future()
        text = arguments if isinstance(arguments, str) else json.dumps(arguments)
        call = common_pb2.FunctionCall(call_id=call_id, name=name, arguments_json=text)
        self._outbox.put_nowait(Response(function_call=call))
        return call_id

    async def call(
        self, name: str, arguments: object, timeout_s: float = 15.0
    ) -> common_pb2.FunctionResult:
        """A function call, and the client's result."""
        call_id = self.send_call(name, arguments)
        return await asyncio.wait_for(asyncio.shield(self.results[call_id]), timeout_s)


@contextlib.asynccontextmanager
async def scripted_gateway() -> AsyncIterator[tuple[ScriptedGateway, str]]:
    gateway = ScriptedGateway()
    server, address = await serve_fake(gateway_pb2_grpc.add_GatewayServicer_to_server, gateway)
    try:
        yield gateway, address
    finally:
        await server.stop(grace=0)


class Leg:
    """A phone's side that can be transferred (never answering: the transfer waits
    until cancelled) and pressed keys on, recording both."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.transferring = asyncio.Event()
        self.transfer_cancelled = False
        self.hung_up: str | None = None
        self.hung_up_at = 0.0
        self.last_speech_at = 0.0  # when the last packet of agent speech went out

    async def send_audio(self, packet: bytes, speaking: bool) -> None:
        if speaking:
            self.last_speech_at = asyncio.get_running_loop().time()

    async def clear(self) -> None:
        pass

    async def hang_up(self, reason: str) -> None:
        self.hung_up = reason
        self.hung_up_at = asyncio.get_running_loop().time()

    async def transfer(self, target_uri: str) -> str:
        self.transferring.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.transfer_cancelled = True
            raise
        return "never"

    async def send_dtmf(self, digits: str) -> None:
        self.keys.append(digits)


def declared(config: gateway_pb2.ConverseConfig) -> dict[str, dict]:
    return {f.name: json.loads(f.parameters_json) for f in config.functions}


async def config(provider: str, **settings: str) -> gateway_pb2.ConverseConfig:
    """The Converse config of a `provider` call on a service with `settings`."""
    telephony = Telephony(TelephonySettings(**settings))  # type: ignore[arg-type]
    try:
        return telephony.new_call(CallInfo(provider), PCMU, Leg()).config()
    finally:
        await telephony.aclose()


async def test_only_what_is_enabled_and_possible_is_declared():
    assert not (await config("sip")).functions  # the default: no call control
    assert list(declared(await config("sip", **ALL_ON))) == [
        "hang_up",
        "transfer_call",
        "send_dtmf",
    ]
    assert list(declared(await config("twilio", **ALL_ON))) == ["hang_up", "transfer_call"]
    assert list(declared(await config("audiosocket", **ALL_ON))) == ["hang_up"]
    assert list(declared(await config("sip", call_control="send_dtmf"))) == ["send_dtmf"]

    functions = (await config("sip", **ALL_ON)).functions
    assert not any(f.read_only for f in functions)  # all have side effects
    assert "goodbye" in functions[0].description
    schemas = {f.name: json.loads(f.parameters_json) for f in functions}
    assert schemas["hang_up"]["properties"] == {}
    assert schemas["transfer_call"]["properties"]["target"]["enum"] == ["sales"]
    assert schemas["send_dtmf"]["required"] == ["digits"]
    assert SALES not in str(functions)  # the model sees names, never the URIs


async def test_bad_calls_get_error_results_and_the_hang_up_cancels_a_transfer_under_way():
    policy = CallControlPolicy.from_settings(TelephonySettings(**ALL_ON))  # type: ignore[arg-type]
    leg = Leg()
    async with (
        scripted_gateway() as (gateway, address),
        grpc.aio.insecure_channel(address) as channel,
    ):
        functions = CallFunctions(policy, "sip")
        call = PhoneCall(channel, SETTINGS, CallInfo("sip"), PCMU, leg, functions)
        running = asyncio.ensure_future(call.run())
        await wait_until(call.started.is_set, "the session to start")
        assert list(declared(gateway.configs[0])) == ["hang_up", "transfer_call", "send_dtmf"]

        for name, arguments, words in [
            ("order_pizza", {}, "no function 'order_pizza'"),
            ("transfer_call", {"target": SALES}, "not a transfer target"),  # names only
            ("transfer_call", {}, "wrong arguments"),
            ("send_dtmf", "{", "not JSON"),
            ("send_dtmf", {"digits": "12x"}, "keys of 0-9"),
            ("hang_up", {"now": True}, "wrong arguments"),
        ]:
            result = await gateway.call(name, arguments)
            assert result.is_error and words in result.output, (name, result.output)
        assert not leg.keys and not leg.transferring.is_set()

        # A transfer runs as a task of its own: the call goes on, keys are pressed.
        asked_at = asyncio.get_running_loop().time()
        transfer = gateway.send_call("transfer_call", {"target": "sales"})
        await asyncio.wait_for(leg.transferring.wait(), 5)
        result = await gateway.call("send_dtmf", {"digits": "12#"})
        assert not result.is_error and result.output == "sent 12#"
        assert leg.keys == ["12#"]

        # The target does not answer (its phone rings on): the model is told what is
        # under way before the oracle's tool_timeout_s (5 s by default) would tell it
        # the call failed, and the transfer goes on.
        result = await asyncio.wait_for(asyncio.shield(gateway.results[transfer]), 10)
        waited = asyncio.get_running_loop().time() - asked_at
        assert not result.is_error and "under way" in result.output, result.output
        assert ANSWER_WITHIN_S <= waited < ORACLE_TOOL_TIMEOUT_S, waited
        assert not leg.transfer_cancelled

        # The caller hangs up: the transfer under way is cancelled.
        call.caller_hung_up()
        assert await asyncio.wait_for(running, 5) is Ended.CALLER_HUNG_UP
        assert leg.transfer_cancelled
        assert gateway.half_closed.is_set()


async def test_a_call_presses_at_most_its_cap_of_keys_and_digits_only_by_default(caplog):
    """The abuse: the model pressed any keys it chose, up to 32 a request and
    without end over a call; behind a PBX, '#' and '*' are toll fraud. The old
    call sent '*9' and a key past the cap, and logged the keys (a PIN) at INFO."""
    settings = TelephonySettings(call_control="send_dtmf", dtmf_send_max_keys=6)  # type: ignore[arg-type]
    leg = Leg()
    async with (
        scripted_gateway() as (gateway, address),
        grpc.aio.insecure_channel(address) as channel,
    ):
        functions = CallFunctions(CallControlPolicy.from_settings(settings), "sip")
        call = PhoneCall(channel, SETTINGS, CallInfo("sip"), PCMU, leg, functions)
        running = asyncio.ensure_future(call.run())
        await wait_until(call.started.is_set, "the session to start")
        (declared_dtmf,) = gateway.configs[0].functions
        assert "[0-9]{1,16}" in declared_dtmf.parameters_json  # the model is told
        with caplog.at_level(logging.INFO, logger="services.telephony"):
            refused = [await gateway.call("send_dtmf", {"digits": keys}) for keys in ("*9", "12#")]
            assert all(r.is_error and "may not be pressed" in r.output for r in refused)
            assert (await gateway.call("send_dtmf", {"digits": "4711"})).output == "sent 4711"
            assert not (await gateway.call("send_dtmf", {"digits": "28"})).is_error
            capped = await gateway.call("send_dtmf", {"digits": "3"})
        assert capped.is_error and "at most 6 keys in all (6 pressed already)" in capped.output
        assert leg.keys == ["4711", "28"]
        assert "sent 4 keys" in caplog.text and "4711" not in caplog.text
        call.caller_hung_up()
        assert await asyncio.wait_for(running, 5) is Ended.CALLER_HUNG_UP


async def test_a_hang_up_during_a_long_goodbye_is_answered_before_the_line_closes():
    """The model calls hang_up while its goodbye still plays, longer than the oracle
    would wait for the call's result: the answer says the call is ending, the
    goodbye plays to its end, then the phone is hung up."""
    policy = CallControlPolicy.from_settings(TelephonySettings(**ALL_ON))  # type: ignore[arg-type]
    leg = Leg()
    async with (
        scripted_gateway() as (gateway, address),
        grpc.aio.insecure_channel(address) as channel,
    ):
        functions = CallFunctions(policy, "sip")
        call = PhoneCall(channel, SETTINGS, CallInfo("sip"), PCMU, leg, functions)
        running = asyncio.ensure_future(call.run())
        await wait_until(call.started.is_set, "the session to start")

        async def goodbye(seconds: float) -> None:
            """Agent speech as the gateway sends it: 80 ms at a time, in real time."""
            for _ in range(round(seconds / 0.08)):
                call.playout.push(b"\x10" * 640, True)
                await asyncio.sleep(0.08)

        speaking = asyncio.ensure_future(goodbye(ANSWER_WITHIN_S + 1.5))
        loop = asyncio.get_running_loop()
        asked_at = loop.time()
        result = await gateway.call("hang_up", {}, timeout_s=10)
        answered_at = loop.time()
        assert not result.is_error and result.output.startswith("hanging up"), result.output
        assert answered_at - asked_at < ORACLE_TOOL_TIMEOUT_S
        assert leg.hung_up is None  # the goodbye still plays

        assert await asyncio.wait_for(running, 15) is Ended.AGENT_HUNG_UP
        await speaking
        assert leg.hung_up is not None and "the agent hung up" in leg.hung_up
        # The whole goodbye played before the line closed, and no second result went out.
        assert answered_at < leg.last_speech_at < leg.hung_up_at
        assert gateway.half_closed.is_set()
        assert [r.output for r in gateway.received] == [result.output]


async def test_baresip_hears_the_keys_gets_the_refer_and_is_hung_up_by_function_calls(tmp_path):
    async with scripted_gateway() as (gateway, address):
        settings = {
            "host": "127.0.0.1",
            "sip_port": 0,
            "metrics_port": 0,
            "gateway_address": address,
            "playout_prebuffer_ms": 60,
            **ALL_ON,
        }
        sip = SipServer(Telephony(TelephonySettings(**settings)))  # type: ignore[arg-type]
        await sip.start()
        try:
            async with baresip_call(sip, tmp_path, 20.0) as (phone, _):
                await one_session(sip)
                (sip_call,) = sip.calls.values()
                (config,) = gateway.configs
                assert [f.name for f in config.functions] == [
                    "hang_up",
                    "transfer_call",
                    "send_dtmf",
                ]

                result = await gateway.call("send_dtmf", {"digits": "12#"})
                assert not result.is_error, result.output
                await wait_until(lambda: keys_heard(phone.events) == "12#", "baresip's keys")

                # REFER to the operator's URI for the name; baresip cannot place the call
                # (its one RTP port pair is this call's) and says so: an error, the call
                # goes on.
                result = await gateway.call("transfer_call", {"target": "sales"})
                transfers = [e["param"] for e in phone.events if e.get("type") == "TRANSFER"]
                assert transfers == [f"<{SALES}>"]
                assert result.is_error and "failed: 5" in result.output, result.output
                assert "sales" in result.output and SALES not in result.output
                assert phone.seen("CALL_CLOSED") is None

                # "Goodbye!" and hang_up: the goodbye plays, then BYE; the result comes
                # back before the half-close.
                assert sip_call.call is not None
                sip_call.call.playout.push(b"\x10" * 4000, True)  # 0.5 s of agent speech
                result = await gateway.call("hang_up", {})
                assert not result.is_error and result.output == "hung up", result.output
                await phone.wait_for("CALL_CLOSED")
                assert sip_call.bye_sent and not sip_call.phone_gone
                await wait_until(lambda: not sip.calls, "the SIP call to end")
                assert gateway.half_closed.is_set()
        finally:
            await sip.stop()
            await sip.telephony.aclose()


async def test_a_transfer_that_rings_on_is_answered_at_once_and_ends_the_call_once_it_works(
    tmp_path,
):
    """SIPp as the transferee: it accepts the REFER and reports 100 Trying, then the
    target rings longer than the oracle waits for a result before 200 OK. The model
    is told the transfer is under way before that wait runs out; the 200 OK then
    ends the call with our BYE (SIPp expects it), and no second result is sent."""
    async with scripted_gateway() as (gateway, address):
        settings = {
            "host": "127.0.0.1",
            "sip_port": 0,
            "metrics_port": 0,
            "gateway_address": address,
            **ALL_ON,
        }
        sip = SipServer(Telephony(TelephonySettings(**settings)))  # type: ignore[arg-type]
        await sip.start()
        try:
            ring_ms = round(ORACLE_TOOL_TIMEOUT_S * 1000) + 1000
            xml = transferee(r"sip:sales@127\.0\.0\.1:5999", "200 OK", ring_ms=ring_ms)
            phone = asyncio.ensure_future(sipp(xml, f"127.0.0.1:{sip.port}", tmp_path))
            await the_call(sip)
            loop = asyncio.get_running_loop()
            asked_at = loop.time()
            result = await gateway.call("transfer_call", {"target": "sales"})
            assert loop.time() - asked_at < ORACLE_TOOL_TIMEOUT_S
            assert not result.is_error and "under way" in result.output, result.output
            assert SALES not in result.output

            sipp_result = await phone  # our BYE after its 200 OK
            assert sipp_result.passed, sipp_result.output
            await wait_until(lambda: not sip.calls, "the SIP call to end")
            assert gateway.half_closed.is_set()
            assert [r.output for r in gateway.received] == [result.output]
        finally:
            await sip.stop()
            await sip.telephony.aclose()
