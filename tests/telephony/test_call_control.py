"""Call control (#33): the agent hangs up, transfers, presses keys, against real
SIP peers: baresip (it hears our RFC 4733 keys, gets our REFER, is hung up with
our BYE) and SIPp (a transferee that accepts the REFER and reports the outcome
in NOTIFYs); and a Twilio transfer, through a client speaking the documented
Media Streams and webhook messages (no Twilio account here). The gateway in
front is real, with scripted fake upstreams; the call control is asked for as
the agent asks it, with a CallControlRequest acted on by call_control.act under the
service's policy."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import REGISTRY

from services.telephony.call import PhoneCall
from services.telephony.call_control import (
    CallControlPolicy,
    CallControlRequest,
    CallControlResult,
    act,
)
from services.telephony.config import ConfigError, TelephonySettings, TransferTarget
from services.telephony.sip import SipCall, SipServer
from services.telephony.sip_dtmf import KEY_PACKETS, KeysOut
from tests.support import wait_until
from tests.telephony import test_sip
from tests.telephony.phone_support import (
    TwilioClient,
    call_params,
    fake_gateway,
    new_call_sid,
    post_webhook,
    telephony_server,
)
from tests.telephony.phone_support import the_call as the_phone_call
from tests.telephony.sip_support import sipp, transferee
from tests.telephony.test_sip import Rig, all_ended, baresip_call, one_session

# The SIP tests' rig: a gateway on the shared fakes, and the SIP servers started.
rig = test_sip.rig

SALES = "sip:sales@127.0.0.1:5999"
# Everything on, and '#' among the keys the agent may press (off by default): the
# tests hear RFC 4733's events for it.
ALL_ON = {
    "call_control": "hang_up,transfer,send_dtmf",
    "transfer_targets": f"sales={SALES}",
    "dtmf_send_allowed": "[0-9#]{1,8}",
}


async def the_call(sip: SipServer) -> tuple[SipCall, PhoneCall]:
    """The one call, once answered: the session starts just before the 200 OK goes
    out, and a call not answered yet refuses call control."""
    await one_session(sip)
    (sip_call,) = sip.calls.values()
    await wait_until(lambda: sip_call.answered, "the 200 OK")
    assert sip_call.call is not None
    return sip_call, sip_call.call


async def act_on(server, call: PhoneCall, request: CallControlRequest) -> CallControlResult:
    """What the agent asks of `call`, done under `server`'s telephony policy."""
    return await act(call, request, server.telephony.call_control)


def refused_transfers() -> float:
    labels = {"provider": "sip", "action": "transfer", "result": "refused"}
    return REGISTRY.get_sample_value("kame_telephony_call_control_total", labels) or 0.0


def keys_heard(events: list[dict]) -> str:
    return "".join(e["param"] for e in events if e.get("type") == "CALL_DTMF_START")


async def test_baresip_hears_the_agents_keys_gets_its_refer_and_is_hung_up(rig: Rig, tmp_path):
    sip = await rig.sip(**ALL_ON)
    refused_before = refused_transfers()
    async with baresip_call(sip, tmp_path, 20.0) as (phone, _):
        sip_call, call = await the_call(sip)

        # Keys as RFC 4733 events in the call's RTP: baresip reports each one.
        result = await act_on(sip, call, CallControlRequest("send_dtmf", digits="12#"))
        assert result.ok, result.detail
        await wait_until(lambda: keys_heard(phone.events) == "12#", "baresip to hear 1, 2, #")

        # A target the operator did not list: refused, and nothing reaches the phone.
        elsewhere = CallControlRequest("transfer", target="sip:mallory@127.0.0.1")
        result = await act_on(sip, call, elsewhere)
        assert not result.ok and "not a transfer target" in result.detail
        assert sip_call.transfer_now is None
        assert refused_transfers() == refused_before + 1

        # The listed one, by its name: baresip gets a REFER to the operator's URI. Its
        # one RTP port pair is this call's, so it cannot place the call to the target
        # and says so in its NOTIFY (500): the transfer failed, and the call goes on.
        result = await act_on(sip, call, CallControlRequest("transfer", target="sales"))
        transfers = [e["param"] for e in phone.events if e.get("type") == "TRANSFER"]
        assert transfers == [f"<{SALES}>"]
        assert not result.ok and "failed: 5" in result.detail, result.detail
        assert sip_call.rtp is not None
        sent = sip_call.rtp.stats["packets_sent"]
        await wait_until(lambda: sip_call.rtp.stats["packets_sent"] > sent + 10, "audio on")
        assert phone.seen("CALL_CLOSED") is None

        # "Please hang up": our BYE ends baresip's call, and the session with it.
        result = await act_on(sip, call, CallControlRequest("hang_up", reason="asked"))
        assert result.ok
        await phone.wait_for("CALL_CLOSED")
        assert sip_call.bye_sent and not sip_call.phone_gone
        await all_ended(rig, sip)


@pytest.mark.parametrize(("outcome", "ok"), [("200 OK", True), ("486 Busy Here", False)])
async def test_a_transfer_ends_the_call_only_when_the_transferee_says_it_worked(
    rig: Rig, tmp_path, outcome: str, ok: bool
):
    """SIPp checks the REFER's Refer-To, accepts it (202), reports 100 Trying then
    the outcome; after 200 OK it expects our BYE, after 486 the call goes on until
    SIPp hangs up."""
    sip = await rig.sip(**ALL_ON)
    xml = transferee(refer_to=r"sip:sales@127\.0\.0\.1:5999", outcome=outcome)
    phone = asyncio.ensure_future(sipp(xml, f"127.0.0.1:{sip.port}", tmp_path))
    _, call = await the_call(sip)
    result = await act_on(sip, call, CallControlRequest("transfer", target=SALES))
    assert result.ok is ok, result.detail
    assert outcome in result.detail
    sipp_result = await phone
    assert sipp_result.passed, sipp_result.output
    await all_ended(rig, sip)
    assert call.ended is not None
    assert ("transferred" in call.status) is ok  # our hang-up said why; SIPp's BYE did not


async def test_a_twilio_transfer_closes_the_stream_and_dials_the_target_after_it(redis_url):
    """Twilio cannot be told to move a call over the stream: the webhook's TwiML
    names <Connect action>, the transfer closes the stream, and the action Twilio
    then asks (signed) answers <Dial> to the operator's URI; other calls hang up."""
    settings = {"call_control": "transfer", "transfer_targets": "sales=tel:+15551230000"}
    async with (
        fake_gateway(redis_url) as gateway,
        telephony_server(gateway.address, **settings) as server,
    ):
        call_sid = new_call_sid()
        answer = await post_webhook(f"{server.url}twilio/voice", call_params(call_sid))
        assert '<Connect action="after">' in answer.body  # only where transfers are on
        twilio = await TwilioClient(answer.stream_url, call_sid, answer.parameters).connect()
        await twilio.start()
        call = await the_phone_call(server)
        result = await act_on(server, call, CallControlRequest("transfer", "sales"))
        assert result.ok, result.detail
        await twilio.wait_for(lambda: twilio.closed, "the stream to close")
        assert twilio.close_code == 1000

        after = f"{server.url}twilio/after"
        answer = await post_webhook(after, call_params(twilio.call_sid))
        assert answer.status == 200
        assert "<Dial><Number>+15551230000</Number></Dial>" in answer.body
        # Dialled once; a call nobody transferred (or a replay) ends; unsigned: 403.
        for call_sid in (twilio.call_sid, new_call_sid()):
            answer = await post_webhook(after, call_params(call_sid))
            assert "<Hangup />" in answer.body and "Dial" not in answer.body
        assert (await post_webhook(after, call_params(new_call_sid()), signed_as="")).status == 403
        await twilio.close()


async def test_an_action_the_operator_did_not_enable_is_refused():
    policy = CallControlPolicy(
        frozenset({"send_dtmf"}), (TransferTarget("sales", SALES),), dtmf_allowed="[0-9#]+"
    )
    assert "not enabled" in policy.refusal(CallControlRequest("hang_up"))
    assert "not enabled" in policy.refusal(CallControlRequest("transfer", target="sales"))
    assert policy.refusal(CallControlRequest("send_dtmf", digits="12#")) == ""
    assert "keys" in policy.refusal(CallControlRequest("send_dtmf", digits="12x"))
    assert "keys" in policy.refusal(CallControlRequest("send_dtmf", digits=""))
    transfers = CallControlPolicy(frozenset({"transfer"}), (TransferTarget("sales", SALES),))
    assert transfers.refusal(CallControlRequest("transfer", target="sales")) == ""
    assert transfers.refusal(CallControlRequest("transfer", target=SALES)) == ""
    assert "not a transfer target" in transfers.refusal(
        CallControlRequest("transfer", target="sip:sales@elsewhere")
    )
    # Off unless listed: the default settings enable nothing.
    assert CallControlPolicy.from_settings(TelephonySettings()).actions == frozenset()

    # What the agent is offered: enabled, and possible on the call's protocol.
    everything = CallControlPolicy.from_settings(TelephonySettings(**ALL_ON))
    assert everything.offered("sip") == (["hang_up", "transfer", "send_dtmf"], ["sales"])
    assert everything.offered("twilio") == (["hang_up", "transfer"], ["sales"])
    assert everything.offered("audiosocket") == (["hang_up"], [])


def test_the_agent_presses_digits_only_unless_the_operator_allows_more():
    """The abuse: behind a PBX, '*' and '#' reach its features (a '#' transfer, an
    outside line); the model chose any keys, up to 32 a request, also right after
    reading a tool's output (toll fraud). The old policy allowed '12#' and '*9'."""
    default = CallControlPolicy.from_settings(TelephonySettings(call_control="send_dtmf"))
    assert default.refusal(CallControlRequest("send_dtmf", digits="4711")) == ""
    for keys in ("12#", "*9", "#", "1A", "1" * 17):
        refusal = default.refusal(CallControlRequest("send_dtmf", digits=keys))
        assert "may not be pressed on this line" in refusal, keys
        assert "[0-9]{1,16}" in refusal  # it says what the line allows
    menus = CallControlPolicy.from_settings(
        TelephonySettings(call_control="send_dtmf", dtmf_send_allowed=r"[0-9]|\*9")
    )
    assert menus.refusal(CallControlRequest("send_dtmf", digits="*9")) == ""
    assert menus.refusal(CallControlRequest("send_dtmf", digits="7")) == ""
    assert "may not be pressed" in menus.refusal(CallControlRequest("send_dtmf", digits="77"))


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ({"dtmf_send_allowed": "[0-9"}, "dtmf_send_allowed: .* is not a regular expression"),
        ({"dtmf_send_max_keys": -1}, "dtmf_send_max_keys: 0 or more"),
        ({"call_control": "hang_up,dial"}, "call_control: dial"),
        ({"call_control": "transfer"}, "transfer_targets"),
        ({"transfer_targets": "sales=http://example.net"}, "transfer_targets"),
        ({"transfer_targets": "sales=sip:a@b>;x=<sip:c@d"}, "transfer_targets"),
    ],
)
def test_call_control_settings_are_checked(settings: dict[str, object], error: str):
    with pytest.raises(ConfigError, match=error):
        TelephonySettings(**settings).validate()  # type: ignore[arg-type]


def test_targets_are_named_or_bare_uris():
    settings = TelephonySettings(transfer_targets=f"sales={SALES}, tel:+15551230000")
    policy = CallControlPolicy.from_settings(settings)
    assert policy.targets == (
        TransferTarget("sales", SALES),
        TransferTarget("tel:+15551230000", "tel:+15551230000"),
    )


async def test_a_key_is_one_timestamp_growing_durations_and_three_end_packets():
    keys = KeysOut()
    done = keys.press("5")
    timestamps = iter(range(1000, 100000, 160))  # the audio clock, one packet a tick
    sent = []
    while keys.pending:
        event = keys.next_packet(next(timestamps))
        if event is not None:
            sent.append((event, keys.event_timestamp))
    assert done.done()
    assert {stamp for _, stamp in sent} == {1000}  # the audio clock's when the key began
    assert [event.starts for event, _ in sent] == [True] + [False] * (len(sent) - 1)
    payloads = [event.payload for event, _ in sent]
    assert all(p[0] == 5 for p in payloads)
    ends = [p for p in payloads if p[1] & 0x80]
    assert len(ends) == 3 and len(set(ends)) == 1
    durations = [int.from_bytes(p[2:4], "big") for p in payloads]
    assert durations[: KEY_PACKETS - 1] == [160 * n for n in range(1, KEY_PACKETS)]
    assert durations[-1] == 160 * KEY_PACKETS
