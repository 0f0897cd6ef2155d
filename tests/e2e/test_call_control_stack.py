"""The agent acts on the phone call it is in, end to end through `kame up` (#33).

`kame up` with call control on for SIP (env KAME_TELEPHONY_CALL_CONTROL and
KAME_TELEPHONY_TRANSFER_TARGETS: the telephony service's own settings), and
two SIP peers nobody here wrote calling its SIP port, each saying its request
in piper's voice (8 kHz through G.711). Each call declares hang_up and
transfer_call in its Converse config, the gateway passes them to the oracle,
whose LLM calls them, and the gateway hands each call back to the telephony
service, which acts on the phone:

- SIPp says "Please transfer me to sales." (RTP from a pcap written here): it
  gets our REFER naming the operator's URI for "sales" (the model only ever
  sees the name), accepts it and reports that the target answered (NOTIFY 200
  OK); our BYE then ends its call (the scenario fails without it);
- baresip says "Please hang up the call now.": it hears the agent's goodbye
  whole, then gets our BYE within BYE_WITHIN_S of the request, long before
  its own microphone file would end the call.

Both sessions end OK, each with its function's result as a tool turn of its
conversation. OpenAI cannot be reached from here: the LLM is
tests/oracle/tool_support.py's fake on the OpenAI wire, which says goodbye and
calls hang_up when asked to hang up, and calls transfer_call to "sales" when
asked for a transfer. One `kame up` (~15-60 s to start on a busy CPU), two
calls of ~10 s each.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np

from kame_cli.bench.baresip import Baresip, caller_wav
from kame_common.audio import SAMPLE_RATE
from tests.e2e.kame_up import running
from tests.e2e.test_tools_stack import FAKE_LLM
from tests.support import conversation, session_record
from tests.support.llm import StubHttpServer
from tests.telephony.phone_support import piper_to_ulaw, quiet_at_end, speech_seconds
from tests.telephony.sip_support import rtp_pcap, sipp, transferee

ASK_TRANSFER = "Please transfer me to sales."
ASK_HANG_UP = "Please hang up the call now."
SALES = "sip:sales@127.0.0.1:5999"  # only SIPp's word says a call to it was answered
CALL_CONTROL_ENV = {
    "KAME_TELEPHONY_CALL_CONTROL": "hang_up,transfer",
    "KAME_TELEPHONY_TRANSFER_TARGETS": f"sales={SALES}",
}
CALL_CONTROL_DB = 13  # the stack's own Redis database: its registry holds only its frontend
LEAD_S = 1.0  # silence before each request
TAIL_S = 60.0  # silence after the hang-up request: baresip hangs up when its file ends
# SIPp's whole call, from its INVITE to our BYE after its NOTIFY 200 OK.
TRANSFER_CALL_S = 40.0
# From the end of the hang-up request to our BYE: the stt's final, the LLM, the
# goodbye played, on a busy CPU.
BYE_WITHIN_S = 25.0


def offered_tools(llm: StubHttpServer) -> set[str]:
    return {
        tool["function"]["name"]
        for post in llm.posts()
        if post.json().get("max_tokens") != 1
        for tool in post.json().get("tools", [])
    }


async def transferred_by_sipp(tmp_path: Path, sip: str, speak) -> None:
    """SIPp asks for sales and plays the transferee to the end (our BYE)."""
    lead = np.zeros(int(LEAD_S * SAMPLE_RATE), np.float32)
    says = rtp_pcap(
        tmp_path / "transfer.pcap", piper_to_ulaw(np.concatenate([lead, speak(ASK_TRANSFER)]))
    )
    workdir = tmp_path / "sipp"
    workdir.mkdir()
    xml = transferee(re.escape(SALES), "200 OK", says=says)
    result = await sipp(xml, sip, workdir, timeout_s=TRANSFER_CALL_S)
    assert result.passed, result.output


async def hung_up_on_baresip(tmp_path: Path, sip: str, speak) -> tuple[np.ndarray, int, float]:
    """baresip asks to hang up and waits for our BYE: what it heard (samples, rate),
    and when (in those samples' time) its request ended."""
    speech = speak(ASK_HANG_UP)
    wav = caller_wav(tmp_path, "caller", speech, SAMPLE_RATE, lead_s=LEAD_S, tail_s=TAIL_S)
    asked_at = LEAD_S + len(speech) / SAMPLE_RATE
    phone = await Baresip(wav).start()
    try:
        await phone.dial(f"sip:agent@{sip}")
        established = await phone.wait_for("CALL_ESTABLISHED", timeout_s=15)
        remaining = established["at"] + asked_at + BYE_WITHIN_S - time.monotonic()
        closed = await phone.wait_for("CALL_CLOSED", timeout_s=max(remaining, 1.0))
        print(f"BYE {closed['at'] - established['at'] - asked_at:.1f} s after the ask")
        heard, rate = phone.heard()
    finally:
        await phone.close()
    return heard, rate, asked_at


async def ended_calls(logs: Path, redis_url: str) -> list[tuple[str, str, list[str]]]:
    """Each call the telephony service ended: how (its log line), the gateway's
    outcome for its session, and the tool turns of its conversation."""
    telephony = (logs / "telephony.log").read_text()
    calls = []
    for session_id, how in re.findall(r"\(session (\S+)\) ended: (.*)$", telephony, re.M):
        record = await session_record(redis_url, session_id)
        turns = await conversation(redis_url, session_id)
        tools = [t["text"] for t in turns if t["role"] == "tool"]
        calls.append((how.strip(), f"{record.get('state')}/{record.get('outcome')}", tools))
    return calls


async def test_the_agent_transfers_a_sipp_call_and_hangs_up_on_baresip(tmp_path, redis_url, speak):
    llm = StubHttpServer(FAKE_LLM)
    llm_url = await llm.start()
    logs = tmp_path / "logs"
    flags = ["--llm-base-url", llm_url + "/v1", "--llm-model", "stub-model"]
    try:
        async with running(flags, logs, redis_url, CALL_CONTROL_DB, CALL_CONTROL_ENV) as stack:
            sip = re.search(r"SIP udp (127\.0\.0\.1:\d+)", stack.printed).group(1)
            await transferred_by_sipp(tmp_path, sip, speak)
            heard, rate, asked_at = await hung_up_on_baresip(tmp_path, sip, speak)
    finally:
        await llm.close()

    # The phones' functions reached the LLM, the URI never did.
    assert {"hang_up", "transfer_call"} <= offered_tools(llm)
    assert SALES not in json.dumps([post.json() for post in llm.posts()])
    # The goodbye said before the call played whole before the line closed.
    after_the_ask = heard[int(asked_at * rate) :]
    print(f"baresip heard {speech_seconds(after_the_ask):.2f} s of speech after the ask")
    assert speech_seconds(after_the_ask) >= 0.3
    assert quiet_at_end(heard, 0.5)

    # The service ended both calls (not the phones), the sessions ended OK, and each
    # function's result reached the oracle: a tool turn of the conversation.
    calls = await ended_calls(logs, stack.redis_url)
    print(f"calls: {calls}")
    assert len(calls) == 2, calls
    (transfer_how, transfer_end, transfer_tools), (hang_up_how, hang_up_end, hang_up_tools) = calls
    assert transfer_how == f"agent_hung_up transferred to {SALES}"
    assert hang_up_how == "agent_hung_up the agent hung up"
    assert transfer_end == hang_up_end == "ended/ok"
    assert len(transfer_tools) == 1 and transfer_tools[0].startswith("transfer_call(")
    assert re.search(
        r"-> (transferred to sales|the transfer to sales is under way)", transfer_tools[0]
    )
    assert len(hang_up_tools) == 1 and re.search(
        r"^hang_up\(.*-> (hung up|hanging up)", hang_up_tools[0]
    )
    # Every function answered within the oracle's wait: no timeout, no error logged.
    oracle = (logs / "oracle.log").read_text()
    telephony = (logs / "telephony.log").read_text()
    assert "did not answer within" not in oracle and "got no result within" not in oracle
    assert "Traceback" not in telephony and "Traceback" not in oracle
